"""The layout rule every chart follows, at any number of runs or variants.

Applied to each figure a page draws (``dashboard.charts.export.figure_dict``), so a
chart builder says what it draws and this says where it goes:

* the title and the axis titles are wrapped at word boundaries to the chart's
  width (a chart card is 460-620 px wide) and the top and left margins grow
  with their lines, so a long title never runs into the y title or off the card;
* the legend sits below the plot, in as many columns (up to 3) as its longest
  label lets fit in the narrowest card, and
  the figure grows by its rows, up to ``MAX_LEGEND_ROWS``; past that the legend
  scrolls inside that bound, so the plot keeps its ``PLOT_HEIGHT`` whatever the
  number of variants (a chart with a row per variant, ``meta["rows"]``, grows
  by ``ROW_PX`` a row instead);
* each axis autoranges to the data but never past the physical bounds a builder
  states (``layout.meta``: ``x_bounds`` / ``y_bounds``, e.g. a KL's [0, None) from
  ``trainer.metric_keys``): a band (mean - std) that would reach below 0 is cut
  there, and the axis stays at 0. An axis titled "step" starts at 0.
"""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
import plotly.graph_objects as go

PLOT_HEIGHT = 280  # px of the plotting area
ROW_PX = 46  # a chart of rows (``layout.meta["rows"]``, one per variant) grows by these
TITLE_CHARS = 58  # characters of a title line (16 px) across a 460 px card
Y_TITLE_CHARS = 34  # a y title runs along the plot's height (12 px)
X_TITLE_CHARS = 64
TITLE_LINE_PX = 22
AXIS_LINE_PX = 16
X_AXIS_PX = 56  # tick labels and the x title's first line, and a gap
LEGEND_ROW_PX = 20
MAX_LEGEND_ROWS = 10
LEGEND_WIDTH_PX = 440  # the narrowest chart card's legend width
LEGEND_CHAR_PX = 7  # width of a legend label's character (12 px font)
LEGEND_SYMBOL_PX = 46  # an entry's symbol and gaps
LEGEND_LABEL_CHARS = 52  # a longer legend label is wrapped onto more lines


def wrap(text: str, width: int) -> str:
    """``text`` broken at word boundaries into lines of at most ``width``
    characters, joined by Plotly's ``<br>`` (existing breaks kept)."""
    lines = []
    for part in text.split("<br>"):
        lines += textwrap.wrap(part, width, break_long_words=False, break_on_hyphens=False) or [""]
    return "<br>".join(lines)


def _lines(text: str) -> int:
    return text.count("<br>") + 1 if text else 0


def legend_entries(fig: go.Figure) -> list[str]:
    """The names the legend shows (traces not hidden from it, one per legend group),
    each wrapped to ``LEGEND_LABEL_CHARS`` on its trace."""
    if fig.layout.showlegend is False:
        return []
    names, groups = [], set()
    for trace in fig.data:
        if getattr(trace, "showlegend", False) is False or not trace.name:
            continue
        group = getattr(trace, "legendgroup", None)
        if group and group in groups:
            continue
        groups.add(group)
        if len(trace.name) > LEGEND_LABEL_CHARS and "<br>" not in trace.name:
            trace.name = wrap(trace.name, LEGEND_LABEL_CHARS)
        names.append(trace.name)
    return names


def _bounds(meta: Any, axis: str) -> tuple[float | None, float | None]:
    raw = meta.get(f"{axis}_bounds") if isinstance(meta, dict) else None
    return (raw[0], raw[1]) if raw else (None, None)


def _clip_values(fig: go.Figure, axis: str, low: float | None, high: float | None) -> None:
    """Cut every trace's numeric values on ``axis`` at the bounds (a band's edge of
    mean - std below 0 is drawn at 0, where the quantity ends)."""
    for trace in fig.data:
        values = getattr(trace, axis, None)
        if values is None or trace.type == "heatmap":
            continue
        try:
            array = np.asarray(values, dtype=float)
        except (TypeError, ValueError):
            continue  # categories
        clipped = np.clip(array, -np.inf if low is None else low, np.inf if high is None else high)
        if not np.array_equal(clipped, array, equal_nan=True):
            trace.update({axis: clipped})


def _bound_axis(fig: go.Figure, axis: str, low: float | None, high: float | None) -> None:
    layout_axis = fig.layout[f"{axis}axis"]
    if layout_axis.type == "log" or layout_axis.range is not None:
        return
    # clipmin / clipmax cut the autorange at a bound (minallowed would pin it there)
    options = {}
    if low is not None:
        options["clipmin"] = low
    if high is not None:
        options["clipmax"] = high
    if options:
        layout_axis.autorangeoptions = options
        _clip_values(fig, axis, low, high)


def fit_layout(fig: go.Figure) -> go.Figure:
    """Apply the rule (module docstring) to ``fig`` in place; returns it."""
    layout = fig.layout
    title = wrap(layout.title.text or "", TITLE_CHARS)
    layout.title.text = title
    y_title = wrap(layout.yaxis.title.text or "", Y_TITLE_CHARS)
    x_title = wrap(layout.xaxis.title.text or "", X_TITLE_CHARS)
    layout.yaxis.title.text = y_title
    layout.xaxis.title.text = x_title
    meta = layout.meta if isinstance(layout.meta, dict) else {}
    x_low, x_high = _bounds(meta, "x")
    if x_low is None and (layout.xaxis.title.text or "").startswith("step"):
        x_low = 0.0
    _bound_axis(fig, "x", x_low, x_high)
    _bound_axis(fig, "y", *_bounds(meta, "y"))

    entries = legend_entries(fig)
    longest = max((len(line) for e in entries for line in e.split("<br>")), default=0)
    entry_px = LEGEND_SYMBOL_PX + LEGEND_CHAR_PX * longest
    columns = max(1, min(3, LEGEND_WIDTH_PX // entry_px))
    # an entry as tall as its tallest in the row; rows of wrapped labels count their lines
    heights = [_lines(e) for e in entries]
    rows = sum(max(heights[i : i + columns]) for i in range(0, len(heights), columns))
    legend_px = min(rows, MAX_LEGEND_ROWS) * LEGEND_ROW_PX + (8 if rows else 0)
    top = 24 + TITLE_LINE_PX * max(1, _lines(title))
    bottom = X_AXIS_PX + AXIS_LINE_PX * max(0, _lines(x_title) - 1) + legend_px
    plot_height = max(PLOT_HEIGHT, ROW_PX * int(meta.get("rows", 0)))
    # A builder's own height (a parallel-coordinates chart) is a floor.
    height = max(top + plot_height + bottom, layout.height or 0)
    left = max(layout.margin.l or 60, 44 + AXIS_LINE_PX * _lines(y_title))
    layout.update(
        height=height,
        margin={"t": top, "b": bottom, "l": left, "r": layout.margin.r or 20},
        # Above the plot area, in the top margin sized for its lines.
        # Plotly anchors a wrapped title by its first line and lifts the block by
        # about a line per extra line: the anchor goes down as much.
        title={
            "y": 1 - (10 + 18 * (max(1, _lines(title)) - 1)) / height,
            "yref": "container",
            "yanchor": "top",
        },
    )
    layout.showlegend = bool(entries)
    if entries:
        layout.legend.update(
            orientation="h",
            xref="container",
            x=0.01,
            xanchor="left",
            yref="container",
            y=legend_px / height,
            yanchor="top",
            entrywidth=entry_px,
            entrywidthmode="pixels",
            maxheight=MAX_LEGEND_ROWS * LEGEND_ROW_PX + 8,
            tracegroupgap=0,  # one row per entry: the height the rule budgets
        )
    return fig
