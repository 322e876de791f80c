"""From stored series to a chart: window, downsample, build the figure (no ORM here).

Views read series with two queries per run set (runs/metrics/read.py
``metric_series_many``), hand the raw series to these functions and return
``export.figure_payload`` or ``export.export_body`` of the result.

A ``Window`` is what live.js asks for: ``max_points`` (None = full
resolution, used for downloads) and an optional ``[start, end]`` step range
(the user zoomed), which is answered at full resolution whenever it fits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from dashboard.charts.aggregate import Band, Series
from dashboard.charts.downsample import (
    MIN_POINTS,
    as_float_array,
    bin_columns,
    select_window,
    window_downsample_many,
)
from dashboard.charts.downsample import window_downsample as _window_downsample
from dashboard.charts.figures import (
    CollapseMarker,
    empty_figure,
    expert_heatmap,
    metric_lines,
    seed_band,
)
from dashboard.charts.style import metric_title
from dashboard.charts.time_axis import TimeAxis

DEFAULT_MAX_POINTS = 500
MAX_MAX_POINTS = 20000


@dataclass(frozen=True)
class Window:
    max_points: int | None = DEFAULT_MAX_POINTS  # None: every point (downloads)
    start: int | None = None
    end: int | None = None

    def __post_init__(self) -> None:
        if self.max_points is not None and not MIN_POINTS <= self.max_points <= MAX_MAX_POINTS:
            raise ValueError(f"max_points must be from {MIN_POINTS} to {MAX_MAX_POINTS}")
        if self.start is not None and self.end is not None and self.start > self.end:
            raise ValueError("start must not be after end")

    def fetch_bounds(self) -> tuple[int | None, int | None]:
        """The step range to read: the window widened by its own width on each side,
        so the point just outside each edge is there for ``select_window`` (the line
        then runs to the edges of the zoomed chart)."""
        if self.start is None and self.end is None:
            return None, None
        pad = max(
            1, (self.end - self.start) if self.start is not None and self.end is not None else 1
        )
        return (
            None if self.start is None else self.start - pad,
            None if self.end is None else self.end + pad,
        )


def thin(
    steps: Sequence[int], values: Sequence[Any], window: Window
) -> tuple[np.ndarray, np.ndarray]:
    """The window of one series, downsampled to ``window.max_points`` keeping extremes."""
    numeric = _numeric(values)
    if window.max_points is None:
        return select_window(steps, numeric, window.start, window.end)
    return _window_downsample(steps, numeric, window.max_points, window.start, window.end)


def thin_many(series: Sequence[Series], window: Window) -> list[tuple[np.ndarray, np.ndarray]]:
    """``thin`` of several series, downsampled together (vectorised, same result)."""
    if window.max_points is None:
        return [thin(x, y, window) for x, y in series]
    return window_downsample_many(
        [(x, _numeric(y)) for x, y in series], window.max_points, window.start, window.end
    )


def has_points(series: Series) -> bool:
    return len(series[0]) > 0


def run_lines(
    series_by_label: Mapping[str, Series],
    key: str,
    window: Window,
    *,
    baseline: str | None = None,
    collapse_markers: Mapping[str, CollapseMarker] | None = None,
    colors: Mapping[str, str] | None = None,
    empty_message: str = "no data yet",
    time_axis: TimeAxis | None = None,
) -> go.Figure:
    """One metric of several runs (one label each), the baseline drawn distinctly.
    ``empty_message`` says why nothing is drawn (dashboard/review/emptiness.py);
    ``time_axis``: steps placed at their times (dashboard/charts/time_axis.py)."""
    if not any(has_points(s) for s in series_by_label.values()):
        return empty_figure(f"{metric_title(key)}: {empty_message}")
    thinned = dict(
        zip(series_by_label, thin_many(list(series_by_label.values()), window), strict=True)
    )
    return metric_lines(
        thinned,
        key,
        baseline=baseline if baseline in thinned else None,
        collapse_markers=collapse_markers,
        colors=colors,
        time_axis=time_axis,
    )


def variant_bands(
    seeds_by_variant: Mapping[str, Sequence[Series]],
    key: str,
    window: Window,
    *,
    band: Band = "minmax",
    colors: Mapping[str, str] | None = None,
) -> go.Figure:
    """Variants over seeds: mean, band and thin seed lines, in the window."""
    windowed = {
        variant: [select_window(s[0], _numeric(s[1]), window.start, window.end) for s in seeds]
        for variant, seeds in seeds_by_variant.items()
    }
    windowed = {v: [s for s in seeds if s[0].size] for v, seeds in windowed.items()}
    windowed = {v: seeds for v, seeds in windowed.items() if seeds}
    if not windowed:
        return empty_figure(f"{metric_title(key)}: no data yet")
    return seed_band(windowed, key, band=band, max_points=window.max_points, colors=colors)


def _numeric(values: Sequence[Any] | np.ndarray) -> list[float | None] | np.ndarray:
    """Values as numbers (an array passes through); anything else is a gap."""
    if isinstance(values, np.ndarray):
        return values
    return [v if isinstance(v, int | float) else None for v in values]


def load_matrix(steps: Sequence[int], vectors: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Stored per-step load vectors -> (steps (n,), matrix (E, n)); a step without a
    vector (or with one of another length) is a NaN column."""
    width = max((len(v) for v in vectors if isinstance(v, list)), default=0)
    matrix = np.full((width, len(steps)), np.nan)
    for j, vector in enumerate(vectors):
        if isinstance(vector, list) and len(vector) == width:
            matrix[:, j] = as_float_array(vector)
    return np.asarray(steps), matrix


def layer_heatmap(
    steps: Sequence[int],
    vectors: Sequence[Any],
    layer: int,
    window: Window,
    *,
    title: str | None = None,
    shared_scale: bool = False,
) -> go.Figure:
    """Expert load of one layer (experts x steps) in the window; columns averaged into
    at most ``max_points`` buckets (a bucket's mean load is still a distribution).
    ``shared_scale``: the fixed color scale of heatmaps compared side by side."""
    x, z = load_matrix(steps, vectors)
    if z.shape[0] == 0 or x.size == 0:
        return empty_figure(f"Expert load, layer {layer}: no data yet")
    keep = np.ones(x.size, dtype=bool)
    if window.start is not None:
        keep &= x >= window.start
    if window.end is not None:
        keep &= x <= window.end
    x, z = x[keep], z[:, keep]
    if x.size == 0:
        return empty_figure(f"Expert load, layer {layer}: no steps in this window")
    if window.max_points is not None:
        x, z = bin_columns(x, z, window.max_points)
    return expert_heatmap(
        x, z, layer, title=title, uirevision="experts/load", shared_scale=shared_scale
    )
