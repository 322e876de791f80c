"""Time-series figures: one metric of several runs (``metric_lines``) and
variants aggregated over seeds (``seed_band``).

Every line chart sets ``hovermode="x unified"`` and a constant ``uirevision`` so
that a live update through ``Plotly.react`` keeps the user's zoom and legend
state, and takes a ``colors`` map (dashboard/charts/style.py ``assign_colors``) so a
run or variant has the same colour on every chart of a page. Titles, axis
formats and units come from the metric registry (trainer.metric_keys
``METRIC_SPECS``) through dashboard/charts/style.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from dashboard.charts.aggregate import Band, SeedAggregate, Series, aggregate_seeds
from dashboard.charts.downsample import as_float_array, downsample, downsample_indices
from dashboard.charts.style import (
    BAND_OPACITY,
    BASELINE_COLOR,
    base_layout,
    color_of,
    constant_range,
    hover_format,
    metric_axis,
    metric_bounds,
    metric_title,
    rgba,
    share_tickformat,
    step_axis,
)
from dashboard.charts.time_axis import TimeAxis
from trainer import metric_keys as mk


@dataclass(frozen=True)
class CollapseMarker:
    """Where and why a run collapsed (summary.json collapse_step, collapse_reason)."""

    step: int
    reason: str = ""


def _marker(value: CollapseMarker | tuple[int, str] | int) -> CollapseMarker:
    if isinstance(value, CollapseMarker):
        return value
    if isinstance(value, tuple):
        return CollapseMarker(int(value[0]), str(value[1]))
    return CollapseMarker(int(value))


def _value_at(steps: np.ndarray, values: np.ndarray, step: int) -> float | None:
    """The last finite value at or before ``step`` (else the first finite one)."""
    finite = np.isfinite(values)
    if not finite.any():
        return None
    before = finite & (steps <= step)
    idx = np.flatnonzero(before)[-1] if before.any() else np.flatnonzero(finite)[0]
    return float(values[idx])


def metric_lines(
    series_by_run: Mapping[str, Series],
    key: str,
    baseline: str | None = None,
    collapse_markers: Mapping[str, CollapseMarker | tuple[int, str] | int] | None = None,
    *,
    colors: Mapping[str, str] | None = None,
    title: str | None = None,
    uirevision: str | None = None,
    time_axis: TimeAxis | None = None,
) -> go.Figure:
    """One metric, every run overlaid.

    baseline: label (a key of series_by_run) of the pinned run, drawn black,
    dashed and first in the legend. collapse_markers: label -> collapse step
    and reason, drawn as a dashed vertical line in the run's colour, an x on
    the curve whose hover gives the reason, and a labelled annotation.
    time_axis: place each run's steps at their wall-clock or relative times
    (dashboard/charts/time_axis.py); default the step axis.
    """
    timed = time_axis is not None and time_axis.is_time
    if baseline is not None and baseline not in series_by_run:
        raise ValueError(f"baseline {baseline!r} is not one of the runs drawn")
    layout = base_layout(
        title=title or metric_title(key),
        x_title="step",
        y_title=metric_title(key),
        uirevision=(uirevision or key) + (f"|{time_axis.mode}" if timed else ""),
    )
    layout["yaxis"].update(metric_axis(key))
    layout["meta"] = {"y_bounds": metric_bounds(key)}
    order = list(series_by_run)
    if baseline is not None:
        order.remove(baseline)
        order.insert(0, baseline)
    # Plain trace dicts and an unvalidated Figure: plotly's per-property
    # validation cost more than downsampling and encoding together (20 runs x
    # 10 charts, docs/benchmarks.md); these dicts use only fixed, valid keys.
    traces: list[dict[str, Any]] = []
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for label in order:
        steps, values = series_by_run[label]
        # Shown in the registry's unit (KL ×1e-3), as in the stability table.
        arrays[label] = (np.asarray(steps), as_float_array(values) * mk.metric_spec(key).scale)
        color = BASELINE_COLOR if label == baseline else color_of(label, colors)
        x = time_axis.x(label, arrays[label][0]) if timed else arrays[label][0]
        traces.append(
            _run_trace(label, x, arrays[label][1], color, label == baseline, hover_format(key))
        )
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i, (label, raw) in enumerate((collapse_markers or {}).items()):
        if label not in arrays:
            continue
        marker = _marker(raw)
        color = BASELINE_COLOR if label == baseline else color_of(label, colors)
        x_at = float(time_axis.x(label, [marker.step])[0]) if timed else marker.step
        shapes.append(_collapse_line(x_at, color))
        annotations.append(_collapse_annotation(label, marker, color, row=i, x=x_at))
        y_at = _value_at(*arrays[label], marker.step)
        if y_at is not None:
            traces.append(_collapse_point(label, marker, color, y_at, x=x_at))
    if shapes:
        layout["shapes"] = shapes
    if annotations:
        layout["annotations"] = annotations
    layout["xaxis"].update(
        time_axis.axis() if timed else step_axis([x for x, _ in arrays.values()])
    )
    if mk.metric_spec(key).is_share:
        layout["yaxis"]["tickformat"] = share_tickformat(y for _, y in arrays.values())
    flat = constant_range((y for _, y in arrays.values()), share=mk.metric_spec(key).is_share)
    if flat is not None:
        layout["yaxis"]["range"] = flat
    return go.Figure(data=traces, layout=layout, _validate=False)


def _run_trace(
    label: str, x: np.ndarray, y: np.ndarray, color: str, is_baseline: bool, y_format: str
) -> dict[str, Any]:
    """One run's line; the baseline's is black, thicker and dashed."""
    return {
        "type": "scatter",
        "x": x,
        "y": y,
        "mode": "lines",
        "name": f"{label} (baseline)" if is_baseline else label,
        "legendgroup": label,
        "line": {"color": color, "width": 2.5 if is_baseline else 1.6}
        | ({"dash": "dash"} if is_baseline else {}),
        "hovertemplate": f"%{{y:{y_format}}}",
        "meta": {"run": label, "role": "baseline" if is_baseline else "run"},
    }


def _collapse_hover(label: str, marker: CollapseMarker) -> str:
    reason = marker.reason or "reason not recorded"
    return f"{label} collapsed at step {marker.step}: {reason}"


def _collapse_line(x: float, color: str) -> dict[str, Any]:
    """A dotted vertical line at the collapse (what fig.add_vline draws), at ``x``: its
    step, or that step's time."""
    return {
        "type": "line",
        "x0": x,
        "x1": x,
        "xref": "x",
        "y0": 0,
        "y1": 1,
        "yref": "y domain",
        "line": {"color": color, "width": 1.2, "dash": "dot"},
    }


def _collapse_annotation(
    label: str, marker: CollapseMarker, color: str, *, row: int, x: float
) -> dict[str, Any]:
    """The collapse's label at the top of the chart, one row per collapsed run."""
    return {
        "x": x,
        "xref": "x",
        "y": 1 - 0.07 * row,
        "yref": "paper",
        "yanchor": "top",
        "xanchor": "left",
        "text": f"{label}: collapse @ {marker.step}",
        "hovertext": _collapse_hover(label, marker),
        "showarrow": False,
        "font": {"color": color, "size": 11},
        "bgcolor": "rgba(255,255,255,0.85)",
    }


def _collapse_point(
    label: str, marker: CollapseMarker, color: str, y_at: float, *, x: float
) -> dict[str, Any]:
    """An x on the run's curve at the collapse step; its hover gives the reason."""
    return {
        "type": "scatter",
        "x": [x],
        "y": [y_at],
        "mode": "markers",
        "name": f"{label} collapse",
        "legendgroup": label,
        "showlegend": False,
        "marker": {"symbol": "x", "size": 11, "color": color, "line": {"width": 1}},
        "hovertemplate": f"{_collapse_hover(label, marker)}<extra></extra>",
        "meta": {
            "run": label,
            "role": "collapse",
            "reason": marker.reason or "reason not recorded",
        },
    }


def seed_band(
    seeds_by_variant: Mapping[str, Sequence[Series]],
    key: str,
    *,
    band: Band = "minmax",
    show_seeds: bool = True,
    max_points: int | None = None,
    colors: Mapping[str, str] | None = None,
    title: str | None = None,
    uirevision: str | None = None,
) -> go.Figure:
    """Variants aggregated over seeds: mean line, a band (min-max or mean +- std)
    and thin per-seed lines, all in the variant's colour.

    max_points: downsample the mean and band to at most this many points,
    keeping the extremes of the band's edges (and each seed line likewise).
    """
    scale = mk.metric_spec(key).scale  # the registry's display unit (KL ×1e-3)
    if scale != 1.0:
        seeds_by_variant = {
            v: [(s[0], as_float_array(s[1]) * scale) for s in seeds]
            for v, seeds in seeds_by_variant.items()
        }
    band_name = "min-max" if band == "minmax" else "±1 std"
    fig = go.Figure(
        layout=base_layout(
            title=title or f"{metric_title(key)}: mean over seeds, {band_name} band",
            x_title="step",
            y_title=metric_title(key),
            uirevision=uirevision or f"seed-band:{key}",
        )
    )
    fig.update_yaxes(**metric_axis(key))
    fig.update_layout(meta={"y_bounds": metric_bounds(key)})
    for variant, seeds in seeds_by_variant.items():
        color = color_of(variant, colors)
        if show_seeds:
            for trace in _seed_lines(variant, seeds, color, max_points):
                fig.add_trace(trace)
        agg = aggregate_seeds(seeds, band)
        for trace in _band_traces(variant, agg, band, color, max_points, hover_format(key)):
            fig.add_trace(trace)
    fig.update_xaxes(
        **step_axis([np.asarray(s[0]) for seeds in seeds_by_variant.values() for s in seeds])
    )
    if mk.metric_spec(key).is_share:
        fig.update_yaxes(
            tickformat=share_tickformat(
                as_float_array(s[1]) for seeds in seeds_by_variant.values() for s in seeds
            )
        )
    flat = constant_range(
        (as_float_array(s[1]) for seeds in seeds_by_variant.values() for s in seeds),
        share=mk.metric_spec(key).is_share,
    )
    if flat is not None:
        fig.update_yaxes(range=flat)
    return fig


def _seed_lines(
    variant: str, seeds: Sequence[Series], color: str, max_points: int | None
) -> list[go.Scatter]:
    """A thin, translucent line per seed of the variant (no legend, no hover)."""
    traces = []
    for i, (steps, values) in enumerate(seeds):
        sx, sy = np.asarray(steps), as_float_array(values)
        if max_points is not None and sx.size > max_points:
            sx, sy = downsample(sx, sy, max_points)
        traces.append(
            go.Scatter(
                x=sx,
                y=sy,
                mode="lines",
                name=f"{variant} seed {i}",
                legendgroup=variant,
                showlegend=False,
                line={"color": color, "width": 0.8},
                opacity=0.45,
                hoverinfo="skip",
                meta={"variant": variant, "role": "seed", "seed_index": i},
            )
        )
    return traces


def _band_traces(
    variant: str, agg: SeedAggregate, band: Band, color: str, max_points: int | None, y_format: str
) -> list[go.Scatter]:
    """The band's lower and upper edges (filled between) and the mean line. With
    ``max_points`` the steps kept are those that keep the extremes of both edges."""
    idx = np.arange(agg.steps.size)
    if max_points is not None and agg.steps.size > max_points:
        half = max(max_points // 2, 4)
        idx = np.union1d(
            downsample_indices(agg.steps, agg.upper, half),
            downsample_indices(agg.steps, agg.lower, half),
        )
    x = agg.steps[idx]
    lower_name, upper_name = ("min", "max") if band == "minmax" else ("mean - std", "mean + std")
    edge = {"mode": "lines", "legendgroup": variant, "showlegend": False, "hoverinfo": "skip"}
    return [
        go.Scatter(
            x=x,
            y=agg.lower[idx],
            name=f"{variant} {lower_name}",
            line={"width": 0, "color": color},
            meta={"variant": variant, "role": "band_lower"},
            **edge,
        ),
        go.Scatter(
            x=x,
            y=agg.upper[idx],
            name=f"{variant} {upper_name}",
            fill="tonexty",
            fillcolor=rgba(color, BAND_OPACITY),
            line={"width": 0, "color": color},
            meta={"variant": variant, "role": "band_upper"},
            **edge,
        ),
        go.Scatter(
            x=x,
            y=agg.mean[idx],
            mode="lines",
            name=variant,
            legendgroup=variant,
            line={"color": color, "width": 2.2},
            customdata=agg.count[idx],
            hovertemplate=f"%{{y:{y_format}}} (mean of %{{customdata}} seeds)",
            meta={"variant": variant, "role": "mean"},
        ),
    ]
