"""Parallel coordinates over an experiment's runs (Plotly ``parcoords``): one axis per
chosen hyperparameter or summary metric, one line per run, coloured by one metric.
A column of numbers is a numeric axis; any other column a categorical one (its
values in order, as ticks). A run without a value on an axis is drawn at the
axis's bottom tick, labelled "(none)" on a categorical axis and below the lowest
value on a numeric one, so no run disappears from the chart."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from dashboard.charts.style import LAB_TEMPLATE

NONE_LABEL = "(none)"


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _dimension(title: str, values: Sequence[Any]) -> dict[str, Any] | None:
    present = [v for v in values if v not in (None, "")]
    if not present:
        return None
    numbers = [_number(v) for v in values]
    if all(n is not None for n, v in zip(numbers, values, strict=True) if v not in (None, "")):
        finite = [n for n in numbers if n is not None]
        lo, hi = min(finite), max(finite)
        below = lo - (0.05 * (hi - lo) if hi > lo else abs(lo) * 0.05 or 1.0)
        missing = any(n is None for n in numbers)
        return {
            "label": title,
            "values": [below if n is None else n for n in numbers],
            "range": [below if missing else lo, hi if hi > lo else hi + 1e-12],
        }
    categories = sorted({str(v) for v in present})
    if any(v in (None, "") for v in values):
        categories = [NONE_LABEL, *categories]
    code = {c: i for i, c in enumerate(categories)}
    return {
        "label": title,
        "values": [code[NONE_LABEL if v in (None, "") else str(v)] for v in values],
        "tickvals": list(range(len(categories))),
        "ticktext": categories,
        "range": [0, max(len(categories) - 1, 1)],
    }


def parallel_coordinates(
    columns: Sequence[tuple[str, Sequence[Any]]], color: tuple[str, Sequence[Any]] | None
) -> go.Figure:
    """``columns``: (axis title, one value per run) each, in axis order; ``color``: the
    column the lines are coloured by (numbers; missing values grey)."""
    dimensions = [d for title, values in columns if (d := _dimension(title, values)) is not None]
    line: dict[str, Any] = {"color": "#1f77b4"}
    if color is not None:
        numbers = [_number(v) for v in color[1]]
        finite = [n for n in numbers if n is not None]
        if finite:
            floor = min(finite)
            line = {
                "color": [floor if n is None else n for n in numbers],
                "colorscale": "Viridis",
                "showscale": True,
                "colorbar": {"title": {"text": color[0]}},
            }
    layout = {
        "template": LAB_TEMPLATE,
        "title": {"text": "Runs in parallel coordinates", "x": 0.01, "xanchor": "left"},
        "margin": {"l": 80, "r": 80, "t": 90, "b": 40},
        "uirevision": "parallel",
    }
    if not dimensions:
        layout["meta"] = {"placeholder": "choose columns that have values to draw"}
        return go.Figure(layout=layout)
    trace = {"type": "parcoords", "dimensions": dimensions, "line": line}
    return go.Figure(data=[trace], layout=layout, _validate=False)
