"""A distribution over steps (an imported TensorBoard histogram, ``dist/<tag>``): its
values at TensorBoard's percentiles (trainer/metric_keys.py DISTRIBUTION_PERCENTS: the
minimum, the -2, -1.5, -1 and -0.5 sigma points of a normal, the median, and up to
the maximum) drawn as nested bands around the median, as TensorBoard's
distributions tab draws them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from dashboard.charts.style import base_layout, step_axis
from trainer import metric_keys as mk

BAND_COLOR = "31,119,180"  # the bands' RGB, more opaque toward the median
# (lower index, upper index) into DISTRIBUTION_PERCENTS, outermost band first
BANDS = ((0, 8), (1, 7), (2, 6), (3, 5))


def distribution_matrix(
    steps: Sequence[int], vectors: Sequence[Any]
) -> tuple[np.ndarray, np.ndarray]:
    """(steps (n,), values (n, 9)); a step without a full vector is a row of NaN."""
    width = len(mk.DISTRIBUTION_PERCENTS)
    values = np.full((len(steps), width), np.nan)
    for i, vector in enumerate(vectors):
        if isinstance(vector, list) and len(vector) == width:
            values[i] = [np.nan if v is None else float(v) for v in vector]
    return np.asarray(steps), values


def distribution_bands(steps: Sequence[int], vectors: Sequence[Any], title: str) -> go.Figure:
    """The distribution's bands and median over steps."""
    x, values = distribution_matrix(steps, vectors)
    layout = base_layout(title=title, x_title="step", y_title="value", uirevision=title)
    layout["xaxis"].update(step_axis([x]))
    traces: list[dict[str, Any]] = []
    percents = mk.DISTRIBUTION_PERCENTS
    for depth, (lo, hi) in enumerate(BANDS):
        opacity = 0.15 + 0.15 * depth
        name = f"{percents[lo]:g}-{percents[hi]:g}%"
        traces.append(
            {
                "type": "scatter",
                "x": x,
                "y": values[:, lo],
                "mode": "lines",
                "line": {"width": 0},
                "showlegend": False,
                "hoverinfo": "skip",
                "legendgroup": name,
            }
        )
        traces.append(
            {
                "type": "scatter",
                "x": x,
                "y": values[:, hi],
                "mode": "lines",
                "fill": "tonexty",
                "fillcolor": f"rgba({BAND_COLOR},{opacity:.2f})",
                "line": {"width": 0},
                "name": name,
                "legendgroup": name,
                "hovertemplate": f"{name}: %{{y:.4g}}<extra></extra>",
            }
        )
    median = percents.index(50.0)
    traces.append(
        {
            "type": "scatter",
            "x": x,
            "y": values[:, median],
            "mode": "lines",
            "name": "median",
            "line": {"color": f"rgb({BAND_COLOR})", "width": 1.6},
            "hovertemplate": "median %{y:.4g}<extra></extra>",
        }
    )
    return go.Figure(data=traces, layout=layout, _validate=False)
