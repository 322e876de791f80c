"""Pure figure builders: plain data in, ``plotly.graph_objects.Figure`` out.

No ORM and no request here: views fetch and downsample the data
(dashboard/downsample.py), then call these. Every line chart sets
``hovermode="x unified"`` and a constant ``uirevision`` so that a live update
through ``Plotly.react`` keeps the user's zoom and legend state, and takes a
``colors`` map (dashboard/style.py ``assign_colors``) so a run or variant has
the same colour on every chart of a page.

A series is ``(steps, values)``: two equal-length sequences, values may hold
None/NaN for gaps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from dashboard.aggregate import Band, Series, aggregate_seeds
from dashboard.downsample import as_float_array, downsample, downsample_indices
from dashboard.stability import STABILITY_COLUMNS, RunStats, StabilityRow, stability_table_rows
from dashboard.style import (
    BAND_OPACITY,
    BASELINE_COLOR,
    LAB_TEMPLATE,
    SHARE_KEYS,
    base_layout,
    color_of,
    metric_title,
    rgba,
    step_axis,
)
from dashboard.survival import (
    LOWER_BOUND_PREFIX,
    Event,
    RunOutcome,
    censor_marks,
    kaplan_meier,
    summarize_outcomes,
)

__all__ = [
    "STABILITY_COLUMNS",
    "CollapseMarker",
    "RunStats",
    "StabilityRow",
    "collapse_strip",
    "expert_heatmap",
    "expert_heatmap_layers",
    "metric_lines",
    "seed_band",
    "stability_table_rows",
    "survival_curves",
]

Outcome = RunOutcome | Event

# Collapse strip: a variant's seeds sit within +-SEED_SPREAD of its tick (axis units).
SEED_SPREAD = 0.18
# Expert-load heatmaps compared side by side: colors span 0 to this many times the
# balanced load (a 4x-overloaded expert and worse saturate).
SHARED_LOAD_SCALE = 4.0


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


def _y_format(key: str) -> tuple[str, str]:
    """(axis tickformat, hover format) for a metric key."""
    return (".0%", ".2%") if key in SHARE_KEYS else ("", ".4g")


def _share_axis(tick_format: str) -> dict[str, str]:
    """A share's y axis: percentages, never below 0 (an all-zero share would
    otherwise autorange to -100%..100%)."""
    return {"tickformat": tick_format, "rangemode": "nonnegative"}


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
) -> go.Figure:
    """One metric, every run overlaid.

    baseline: label (a key of series_by_run) of the pinned run, drawn black,
    dashed and first in the legend. collapse_markers: label -> collapse step
    and reason, drawn as a dashed vertical line in the run's colour, an x on
    the curve whose hover gives the reason, and a labelled annotation.
    """
    if baseline is not None and baseline not in series_by_run:
        raise ValueError(f"baseline {baseline!r} is not one of the runs drawn")
    tick_format, hover_format = _y_format(key)
    layout = base_layout(
        title=title or metric_title(key),
        x_title="step",
        y_title=metric_title(key),
        uirevision=uirevision or key,
    )
    if tick_format:
        layout["yaxis"].update(_share_axis(tick_format))
    order = list(series_by_run)
    if baseline is not None:
        order.remove(baseline)
        order.insert(0, baseline)
    # Plain trace dicts and an unvalidated Figure: plotly's per-property
    # validation cost more than downsampling and encoding together (20 runs x
    # 10 charts, docs/benchmarks.md); these dicts use only fixed, valid keys.
    traces: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for label in order:
        steps, values = series_by_run[label]
        x, y = np.asarray(steps), as_float_array(values)
        arrays[label] = (x, y)
        is_baseline = label == baseline
        color = BASELINE_COLOR if is_baseline else color_of(label, colors)
        traces.append(
            {
                "type": "scatter",
                "x": x,
                "y": y,
                "mode": "lines",
                "name": f"{label} (baseline)" if is_baseline else label,
                "legendgroup": label,
                "line": {"color": color, "width": 2.5 if is_baseline else 1.6}
                | ({"dash": "dash"} if is_baseline else {}),
                "hovertemplate": f"%{{y:{hover_format}}}",
                "meta": {"run": label, "role": "baseline" if is_baseline else "run"},
            }
        )
    for i, (label, raw) in enumerate((collapse_markers or {}).items()):
        if label not in arrays:
            continue
        marker = _marker(raw)
        color = BASELINE_COLOR if label == baseline else color_of(label, colors)
        reason = marker.reason or "reason not recorded"
        hover = f"{label} collapsed at step {marker.step}: {reason}"
        shapes.append(  # what fig.add_vline draws
            {
                "type": "line",
                "x0": marker.step,
                "x1": marker.step,
                "xref": "x",
                "y0": 0,
                "y1": 1,
                "yref": "y domain",
                "line": {"color": color, "width": 1.2, "dash": "dot"},
            }
        )
        annotations.append(
            {
                "x": marker.step,
                "xref": "x",
                "y": 1 - 0.07 * i,
                "yref": "paper",
                "yanchor": "top",
                "xanchor": "left",
                "text": f"{label}: collapse @ {marker.step}",
                "hovertext": hover,
                "showarrow": False,
                "font": {"color": color, "size": 11},
                "bgcolor": "rgba(255,255,255,0.85)",
            }
        )
        y_at = _value_at(*arrays[label], marker.step)
        if y_at is not None:
            traces.append(
                {
                    "type": "scatter",
                    "x": [marker.step],
                    "y": [y_at],
                    "mode": "markers",
                    "name": f"{label} collapse",
                    "legendgroup": label,
                    "showlegend": False,
                    "marker": {"symbol": "x", "size": 11, "color": color, "line": {"width": 1}},
                    "hovertemplate": f"{hover}<extra></extra>",
                    "meta": {"run": label, "role": "collapse", "reason": reason},
                }
            )
    if shapes:
        layout["shapes"] = shapes
    if annotations:
        layout["annotations"] = annotations
    layout["xaxis"].update(step_axis([x for x, _ in arrays.values()]))
    return go.Figure(data=traces, layout=layout, _validate=False)


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
    tick_format, hover_format = _y_format(key)
    band_name = "min-max" if band == "minmax" else "±1 std"
    fig = go.Figure(
        layout=base_layout(
            title=title or f"{metric_title(key)}: mean over seeds, {band_name} band",
            x_title="step",
            y_title=metric_title(key),
            uirevision=uirevision or f"seed-band:{key}",
        )
    )
    if tick_format:
        fig.update_yaxes(**_share_axis(tick_format))
    for variant, seeds in seeds_by_variant.items():
        color = color_of(variant, colors)
        agg = aggregate_seeds(seeds, band)
        idx = np.arange(agg.steps.size)
        if max_points is not None and agg.steps.size > max_points:
            half = max(max_points // 2, 4)
            idx = np.union1d(
                downsample_indices(agg.steps, agg.upper, half),
                downsample_indices(agg.steps, agg.lower, half),
            )
        x = agg.steps[idx]
        if show_seeds:
            for i, (steps, values) in enumerate(seeds):
                sx, sy = np.asarray(steps), as_float_array(values)
                if max_points is not None and sx.size > max_points:
                    sx, sy = downsample(sx, sy, max_points)
                fig.add_trace(
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
        lower_name, upper_name = (
            ("min", "max") if band == "minmax" else ("mean - std", "mean + std")
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=agg.lower[idx],
                mode="lines",
                name=f"{variant} {lower_name}",
                legendgroup=variant,
                showlegend=False,
                line={"width": 0, "color": color},
                hoverinfo="skip",
                meta={"variant": variant, "role": "band_lower"},
            )
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=agg.upper[idx],
                mode="lines",
                name=f"{variant} {upper_name}",
                legendgroup=variant,
                showlegend=False,
                fill="tonexty",
                fillcolor=rgba(color, BAND_OPACITY),
                line={"width": 0, "color": color},
                hoverinfo="skip",
                meta={"variant": variant, "role": "band_upper"},
            )
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=agg.mean[idx],
                mode="lines",
                name=variant,
                legendgroup=variant,
                line={"color": color, "width": 2.2},
                customdata=agg.count[idx],
                hovertemplate=f"%{{y:{hover_format}}} (mean of %{{customdata}} seeds)",
                meta={"variant": variant, "role": "mean"},
            )
        )
    fig.update_xaxes(
        **step_axis([np.asarray(s[0]) for seeds in seeds_by_variant.values() for s in seeds])
    )
    return fig


def expert_heatmap(
    steps: Sequence[int] | np.ndarray,
    load_matrix: Sequence[Sequence[float]] | np.ndarray,
    layer: int,
    *,
    title: str | None = None,
    uirevision: str | None = None,
    shared_scale: bool = False,
) -> go.Figure:
    """Expert load of one MoE layer: experts (rows) x steps (columns).

    load_matrix: (E, n) share of routed assignments per expert and step
    (experts/load/L{layer}); balanced load is 1/E in every cell.
    ``shared_scale``: colors span 0 to ``SHARED_LOAD_SCALE`` x balanced load
    (capped at 100%) instead of this run's own maximum, so heatmaps of
    different runs side by side read alike (a run within +-40% of balance must
    not look as skewed as one with an expert at 60%); hover shows the value.
    """
    fig = go.Figure(
        layout=base_layout(
            title=title or f"Expert load, layer {layer}",
            x_title="step",
            y_title="expert",
            uirevision=uirevision or f"experts/load/L{layer}",
            hovermode="closest",
        )
    )
    fig.add_trace(_heatmap_trace(steps, load_matrix, layer, shared_scale=shared_scale))
    fig.update_xaxes(**step_axis([np.asarray(steps)]))
    return fig


def _heatmap_trace(
    steps: Sequence[int] | np.ndarray,
    load_matrix: Sequence[Sequence[float]] | np.ndarray,
    layer: int,
    *,
    shared_scale: bool = False,
) -> go.Heatmap:
    z = np.asarray(load_matrix, dtype=np.float64)
    x = np.asarray(steps)
    if z.ndim != 2 or z.shape[1] != x.size:
        raise ValueError(f"load_matrix must be (experts, {x.size}), got {z.shape}")
    n_experts = z.shape[0]
    balanced = 1 / n_experts
    zmax = min(1.0, SHARED_LOAD_SCALE * balanced) if shared_scale else None
    return go.Heatmap(
        x=x,
        y=np.arange(n_experts),
        z=z,
        zmin=0.0,
        zmax=zmax,
        colorscale="Viridis",
        colorbar={"title": {"text": f"load (balanced = {balanced:.1%})"}, "tickformat": ".0%"},
        name=f"layer {layer}",
        hovertemplate="step %{x}<br>expert %{y}<br>load %{z:.1%}<extra></extra>",
        meta={"layer": layer, "role": "expert_load"},
    )


def expert_heatmap_layers(
    by_layer: Mapping[int, tuple[Sequence[int] | np.ndarray, np.ndarray]],
    *,
    uirevision: str = "experts/load",
) -> go.Figure:
    """One heatmap per MoE layer with a layer picker (a dropdown); the first layer shows."""
    layers = list(by_layer)
    if not layers:
        raise ValueError("no layers to draw")
    fig = go.Figure(
        layout=base_layout(
            title=f"Expert load, layer {layers[0]}",
            x_title="step",
            y_title="expert",
            uirevision=uirevision,
            hovermode="closest",
        )
    )
    for i, layer in enumerate(layers):
        steps, matrix = by_layer[layer]
        trace = _heatmap_trace(steps, matrix, layer)
        trace.visible = i == 0
        fig.add_trace(trace)
    buttons = [
        {
            "label": f"layer {layer}",
            "method": "update",
            "args": [
                {"visible": [j == i for j in range(len(layers))]},
                {"title.text": f"Expert load, layer {layer}"},
            ],
        }
        for i, layer in enumerate(layers)
    ]
    fig.update_layout(
        updatemenus=[
            {"buttons": buttons, "direction": "down", "x": 1.0, "xanchor": "right", "y": 1.12}
        ]
    )
    return fig


def _events(outcomes: Sequence[Outcome]) -> list[tuple[int, bool, str]]:
    """(step, collapsed, seed label) per run."""
    out = []
    for i, o in enumerate(outcomes):
        if isinstance(o, RunOutcome):
            name = o.label or (f"seed {o.seed}" if o.seed is not None else f"run {i}")
            out.append((o.step, o.collapsed, name))
        else:
            out.append((int(o[0]), bool(o[1]), f"run {i}"))
    return out


def collapse_strip(
    outcomes_by_variant: Mapping[str, Sequence[Outcome]],
    *,
    colors: Mapping[str, str] | None = None,
    title: str = "Collapse step per seed",
    uirevision: str = "collapse-strip",
) -> go.Figure:
    """Each seed a point at its collapse step; a seed that never collapsed is an
    open up-triangle at its last step labelled ">= N" (it survived at least that
    long; seeds censored at the same step share one drawn label, the download
    has each seed's). A wide dash marks the variant's mean, labelled as in the
    table, the label to the right of the seeds so the two never overlap."""
    variants = list(outcomes_by_variant)
    fig = go.Figure(
        layout=base_layout(
            title=title,
            x_title="variant",
            y_title="collapse step",
            uirevision=uirevision,
            hovermode="closest",
        )
    )
    fig.update_xaxes(
        tickmode="array",
        tickvals=list(range(len(variants))),
        ticktext=variants,
        range=[-0.6, len(variants) - 0.4],
    )
    for pos, variant in enumerate(variants):
        color = color_of(variant, colors)
        events = _events(outcomes_by_variant[variant])
        # Spread seeds sideways in a fixed pattern so equal steps do not overlap.
        offsets = (
            np.linspace(-SEED_SPREAD, SEED_SPREAD, len(events)) if len(events) > 1 else np.zeros(1)
        )
        for collapsed in (True, False):
            chosen = [(off, e) for off, e in zip(offsets, events, strict=True) if e[1] is collapsed]
            if not chosen:
                continue
            steps = [e[0] for _, e in chosen]
            labels = None if collapsed else [f"{LOWER_BOUND_PREFIX}{s}" for s in steps]
            hovers = [
                f"{e[2]}: collapsed at step {e[0]}"
                if collapsed
                else f"{e[2]}: no collapse by step {e[0]} (censored)"
                for _, e in chosen
            ]
            fig.add_trace(
                go.Scatter(
                    x=[pos + off for off, _ in chosen],
                    y=steps,
                    mode="markers" if collapsed else "markers+text",
                    name=f"{variant}: collapsed" if collapsed else f"{variant}: censored",
                    legendgroup=variant,
                    marker={
                        "symbol": "circle" if collapsed else "triangle-up-open",
                        "size": 10 if collapsed else 12,
                        "color": color,
                        "line": {"width": 1.5, "color": color},
                    },
                    text=None if labels is None else _one_label_per_step(steps, labels),
                    textposition="top center",
                    textfont={"color": color, "size": 10},
                    hovertext=hovers,
                    hoverinfo="text",
                    meta={
                        "variant": variant,
                        "role": "collapsed" if collapsed else "censored",
                        "export_x": [variant] * len(chosen),
                        **({} if labels is None else {"export_text": labels}),
                    },
                )
            )
        summary = summarize_outcomes(variant, [(e[0], e[1]) for e in events])
        if summary.mean_step is not None:
            fig.add_trace(
                go.Scatter(
                    x=[pos],
                    y=[summary.mean_step],
                    mode="markers",
                    name=f"{variant}: mean",
                    legendgroup=variant,
                    showlegend=False,
                    marker={
                        "symbol": "line-ew-open",
                        "size": 36,
                        "color": color,
                        "line": {"width": 3},
                    },
                    text=[summary.label],
                    hovertext=[f"{variant}: mean {summary.label} ({summary.count_label})"],
                    hoverinfo="text",
                    meta={"variant": variant, "role": "mean", "export_x": [variant]},
                )
            )
            fig.add_trace(  # the mean's label, drawn right of every seed's point
                go.Scatter(
                    x=[pos + SEED_SPREAD + 0.06],
                    y=[summary.mean_step],
                    mode="text",
                    name=f"{variant}: mean label",
                    legendgroup=variant,
                    showlegend=False,
                    text=[summary.label],
                    textposition="middle right",
                    textfont={"color": color},
                    hoverinfo="skip",
                    meta={"variant": variant, "role": "mean label", "export": False},
                )
            )
    return fig


def _one_label_per_step(steps: Sequence[int], labels: Sequence[str]) -> list[str]:
    """``labels`` with only the middle point of each group of equal steps labelled
    (the points sit side by side, and equal labels would print over each other)."""
    shown = [""] * len(labels)
    by_step: dict[int, list[int]] = {}
    for i, step in enumerate(steps):
        by_step.setdefault(step, []).append(i)
    for members in by_step.values():
        middle = members[len(members) // 2]
        shown[middle] = labels[middle]
    return shown


def survival_curves(
    outcomes_by_variant: Mapping[str, Sequence[Outcome]],
    *,
    colors: Mapping[str, str] | None = None,
    title: str = "Share of runs not yet collapsed (Kaplan-Meier)",
    uirevision: str = "survival",
) -> go.Figure:
    """Kaplan-Meier survival per variant as a step line; censored runs as ticks on it."""
    fig = go.Figure(
        layout=base_layout(
            title=title, x_title="step", y_title="runs not yet collapsed", uirevision=uirevision
        )
    )
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    for variant, outcomes in outcomes_by_variant.items():
        color = color_of(variant, colors)
        events = [(e[0], e[1]) for e in _events(outcomes)]
        steps, survival = kaplan_meier(events)
        if not steps:
            continue
        summary = summarize_outcomes(variant, events)
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=survival,
                mode="lines",
                line={"shape": "hv", "color": color, "width": 2},
                name=f"{variant} ({summary.count_label})",
                legendgroup=variant,
                hovertemplate="%{y:.0%} not collapsed",
                meta={"variant": variant, "role": "survival"},
            )
        )
        cx, cy = censor_marks(events)
        if cx:
            fig.add_trace(
                go.Scatter(
                    x=cx,
                    y=cy,
                    mode="markers",
                    name=f"{variant} censored",
                    legendgroup=variant,
                    showlegend=False,
                    marker={
                        "symbol": "line-ns-open",
                        "size": 12,
                        "color": color,
                        "line": {"width": 2},
                    },
                    hovertemplate="censored (no collapse by step %{x})<extra></extra>",
                    meta={"variant": variant, "role": "censored"},
                )
            )
    return fig


def empty_figure(message: str) -> go.Figure:
    """A blank chart with a centred message (no runs selected, no data yet)."""
    fig = go.Figure(layout={"template": LAB_TEMPLATE})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.add_annotation(
        text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font={"size": 14}
    )
    return fig
