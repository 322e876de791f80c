"""Colours, titles and the shared layout of every dashboard chart.

Colours: one palette whose every colour has at least 3:1 contrast against the
white plot background (WCAG 2.1 success criterion 1.4.11, non-text contrast),
so thin lines stay readable; a page assigns colours to its runs or variants
once (``assign_colors``) and passes the map to every figure, so a run keeps its
colour across charts.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from trainer import metric_keys as mk

PALETTE: tuple[str, ...] = (
    "#1f5fa8",  # blue
    "#c0392b",  # red
    "#1e7d45",  # green
    "#7d3c98",  # purple
    "#b35309",  # dark orange
    "#0f7282",  # teal
    "#8c564b",  # brown
    "#c2185b",  # magenta
    "#4d5d6e",  # slate
    "#6b6b00",  # olive
    "#2e4053",  # navy
    "#a04000",  # rust
)
BASELINE_COLOR = "#111111"
TEXT_COLOR = "#1a1a1a"
GRID_COLOR = "#e3e3e3"
BAND_OPACITY = 0.18

# A small template of our own instead of plotly's default: readable dark-on-light
# and a few hundred bytes in each JSON payload instead of the default's ~8 kB.
LAB_TEMPLATE = go.layout.Template(
    layout={
        "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "color": TEXT_COLOR},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "colorway": list(PALETTE),
        "xaxis": {"gridcolor": GRID_COLOR, "zerolinecolor": "#c8c8c8", "linecolor": "#9a9a9a"},
        # "e" notation, never SI prefixes (Plotly's default would label 4e-5 "40μ").
        "yaxis": {
            "gridcolor": GRID_COLOR,
            "zerolinecolor": "#c8c8c8",
            "linecolor": "#9a9a9a",
            "exponentformat": "e",
        },
        "hoverlabel": {"font": {"color": TEXT_COLOR}, "bgcolor": "#ffffff"},
        "legend": {"bgcolor": "rgba(255,255,255,0.8)"},
    }
)


def metric_title(key: str) -> str:
    """The chart title of a metric, from the registry (trainer.metric_keys METRIC_SPECS)."""
    return mk.metric_spec(key).title


def metric_axis(key: str) -> dict[str, Any]:
    """Plotly y-axis settings of a metric, from the registry: its title (with the
    unit), percent ticks that never go below 0 for a share (an all-zero share would
    otherwise autorange to -100%..100%), a log axis where the spec asks for one."""
    spec = mk.metric_spec(key)
    axis: dict[str, Any] = {"title": {"text": spec.axis_title}}
    if spec.axis_format:
        axis |= {"tickformat": spec.axis_format, "rangemode": "nonnegative"}
    if spec.log_scale:
        axis["type"] = "log"
    elif spec.scale != 1.0:
        # A scaled metric's title names the scale (×1e-3); ticks in plain decimals
        # ("0.0004"), never a second exponent ("4e-4") that reads as another scale.
        axis["tickformat"] = "~r"
    return axis


def metric_bounds(key: str) -> list[float | None]:
    """The metric's physical bounds in the unit it is drawn in (the registry's scale
    applied), for ``layout.meta["y_bounds"]`` (dashboard.charts.layout)."""
    spec = mk.metric_spec(key)
    return [None if b is None else b * spec.scale for b in spec.bounds]


def share_tickformat(values: Iterable[Any]) -> str:
    """Percent ticks with as many decimals as the data's range needs: about five
    ticks over the range, each label distinct ("0%, 0%, 1%, 1%" otherwise when
    every value lies under 2%). Plotly picks the tick positions; this only picks
    their precision."""
    finite = [v for arr in values for v in np.ravel(np.asarray(arr, dtype=float)) if np.isfinite(v)]
    if not finite:
        return ".0%"
    top = max(max(finite), 0.0)  # the axis starts at 0 (rangemode nonnegative)
    bottom = min(min(finite), 0.0)
    step_pct = (top - bottom) * 100 / 5
    if step_pct <= 0:
        return ".0%"
    decimals = max(0, math.ceil(-math.log10(step_pct)))
    return f".{min(decimals, 4)}%"


def constant_range(values: Iterable[Any], *, share: bool) -> list[float] | None:
    """An explicit y range when every finite value is the same, else None (autorange).

    Plotly pads a flat line by the value itself (a constant 100% accuracy gets
    an axis to 200%): a share keeps its natural [0, 100%]; any other metric gets
    10% of its value either side (or +-1 around 0)."""
    finite = [v for arr in values for v in np.ravel(np.asarray(arr, dtype=float)) if np.isfinite(v)]
    if not finite or max(finite) != min(finite):
        return None
    value = finite[0]
    if share and 0.0 <= value <= 1.0:
        return [0.0, 1.0]
    pad = abs(value) * 0.1 or 1.0
    return [value - pad, value + pad]


def hover_format(key: str) -> str:
    """The d3 format of a metric's values in hover labels."""
    return mk.metric_spec(key).hover_format


def stable_color(label: str) -> str:
    """A palette colour chosen by hashing the label: the same label, the same colour."""
    digest = hashlib.sha1(label.encode("utf-8")).digest()
    return PALETTE[digest[0] % len(PALETTE)]


def assign_colors(
    labels: Iterable[str], existing: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Palette colours in order of first appearance (distinct for up to len(PALETTE) labels).

    Labels already in ``existing`` keep their colour; the rest take the next
    colours not yet used.
    """
    colors = dict(existing or {})
    used = set(colors.values())
    free = [c for c in PALETTE if c not in used]
    for label in labels:
        if label in colors:
            continue
        colors[label] = free.pop(0) if free else stable_color(label)
    return colors


def variant_colors(variants: Iterable[str]) -> dict[str, str]:
    """Colours of variants by name order, not by the order a page meets them: the
    experiment page, its sweep pages and its stability review give a variant the
    same colour."""
    return assign_colors(sorted(set(variants)))


def color_of(label: str, colors: Mapping[str, str] | None) -> str:
    if colors and label in colors:
        return colors[label]
    return stable_color(label)


def rgba(hex_color: str, alpha: float) -> str:
    """'#rrggbb' -> 'rgba(r,g,b,alpha)' for translucent bands."""
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


# Step spans up to this long get one tick per step (steps are whole numbers).
SHORT_STEP_SPAN = 10


def step_axis(steps: Sequence[np.ndarray]) -> dict:
    """x-axis settings for ``steps`` (the drawn step arrays): a whole-number tick per
    step when the span is short, where Plotly would otherwise label 0.5, 1.5, ...
    (a new poll recomputes this as a run grows)."""
    drawn = [s for s in steps if len(s)]
    if not drawn:
        return {}
    span = max(float(np.max(s)) for s in drawn) - min(float(np.min(s)) for s in drawn)
    return {"dtick": 1, "tick0": 0} if span <= SHORT_STEP_SPAN else {}


def base_layout(
    *, title: str, x_title: str, y_title: str, uirevision: str, hovermode: str | bool = "x unified"
) -> dict:
    """Layout shared by the line charts. ``uirevision`` is constant per chart so that
    Plotly.react with new data keeps the user's zoom and legend choices."""
    return {
        "template": LAB_TEMPLATE,
        "title": {"text": title, "x": 0.01, "xanchor": "left"},
        "xaxis": {"title": {"text": x_title}},
        # automargin: long tick labels (KL's e-notation) push the title out, not into them
        "yaxis": {"title": {"text": y_title}, "automargin": True},
        "hovermode": hovermode,
        "uirevision": uirevision,
        # Below the plot: long run names wrap there instead of covering the title.
        "legend": {"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0, "xanchor": "left"},
        "margin": {"l": 60, "r": 20, "t": 50, "b": 90},
    }
