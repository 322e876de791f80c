"""Collapse and survival figures of a stability review: the collapse step of
every seed per variant (``collapse_strip``) and Kaplan-Meier survival curves
(``survival_curves``), censored runs (never collapsed) marked on both, and the
share collapsed per rollout precision of a dose study (``dose_response``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from dashboard.charts.layout import wrap
from dashboard.charts.style import base_layout, color_of
from dashboard.charts.survival import (
    LOWER_BOUND_PREFIX,
    CollapseSummary,
    Event,
    RunOutcome,
    censor_marks,
    kaplan_meier,
    summarize_outcomes,
)

Outcome = RunOutcome | Event

# Collapse strip: a variant's seeds sit within +-SEED_SPREAD of its row (axis units).
SEED_SPREAD = 0.18
VARIANT_LABEL_CHARS = 24  # a variant's name beside its row, wrapped to lines this long
CENSORED = "triangle-right-open"  # survived up to here, and on
KEY_COLOR = "#4d5d6e"


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
    """One row per variant (its name wrapped beside it, however many variants),
    each seed a point at its collapse step; a seed that never collapsed is an open
    right-triangle at its censoring step labelled ">= N" (its collapse, if it ever
    comes, is at least that late; seeds censored at one step share one drawn
    label, the download has each seed's). A tall dash marks the variant's mean,
    labelled as in the table, under the row's seeds so the two never overlap.
    The legend is only the key to the two marks; the rows name the variants."""
    variants = list(outcomes_by_variant)
    fig = go.Figure(
        layout=base_layout(
            title=title,
            x_title="step",
            y_title="",
            uirevision=uirevision,
            hovermode="closest",
        )
    )
    fig.update_yaxes(
        tickmode="array",
        tickvals=list(range(len(variants))),
        ticktext=[wrap(v, VARIANT_LABEL_CHARS) for v in variants],
        range=[len(variants) - 0.5, -0.5],  # the first variant on top
        automargin=True,
        zeroline=False,
    )
    fig.update_layout(meta={"x_bounds": [0, None], "rows": len(variants)})
    for pos, variant in enumerate(variants):
        color = color_of(variant, colors)
        events = _events(outcomes_by_variant[variant])
        # Spread seeds in a fixed pattern across the row so equal steps do not overlap.
        offsets = (
            np.linspace(-SEED_SPREAD, SEED_SPREAD, len(events)) if len(events) > 1 else np.zeros(1)
        )
        for collapsed in (True, False):
            chosen = [(off, e) for off, e in zip(offsets, events, strict=True) if e[1] is collapsed]
            if chosen:
                fig.add_trace(_seed_points(variant, pos, chosen, color, collapsed=collapsed))
        summary = summarize_outcomes(variant, [(e[0], e[1]) for e in events])
        if summary.mean_step is not None:
            for trace in _mean_marks(variant, pos, summary, color):
                fig.add_trace(trace)
    add_outcome_key(fig, CENSORED)
    return fig


def add_outcome_key(fig: go.Figure, censored_symbol: str, size: int = 10) -> None:
    """Two legend entries that explain the marks, in a neutral colour: a filled
    circle for a collapse, ``censored_symbol`` for a run that never collapsed.
    They draw nothing and are not exported."""
    for name, symbol in (("collapsed", "circle"), ("never collapsed (censored)", censored_symbol)):
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=name,
                marker={"symbol": symbol, "size": size, "color": KEY_COLOR},
                hoverinfo="skip",
                meta={"role": "key", "export": False},
            )
        )


def _seed_points(
    variant: str,
    pos: int,
    chosen: list[tuple[float, tuple[int, bool, str]]],
    color: str,
    *,
    collapsed: bool,
) -> go.Scatter:
    """The variant's collapsed seeds (filled circles) or censored ones (open
    triangles labelled ">= N"), each at its offset within the variant's row."""
    steps = [e[0] for _, e in chosen]
    labels = None if collapsed else [f"{LOWER_BOUND_PREFIX}{s}" for s in steps]
    hovers = [
        f"{e[2]}: collapsed at step {e[0]}"
        if collapsed
        else f"{e[2]}: no collapse in its {e[0]} steps (censored)"
        for _, e in chosen
    ]
    return go.Scatter(
        x=steps,
        y=[pos + off for off, _ in chosen],
        mode="markers" if collapsed else "markers+text",
        name=f"{variant}: collapsed" if collapsed else f"{variant}: censored",
        legendgroup=variant,
        showlegend=False,
        marker={
            "symbol": "circle" if collapsed else CENSORED,
            "size": 10 if collapsed else 12,
            "color": color,
            "line": {"width": 1.5, "color": color},
        },
        text=None if labels is None else _one_label_per_step(steps, labels),
        textposition="middle left",
        textfont={"color": color, "size": 10},
        cliponaxis=False,
        hovertext=hovers,
        hoverinfo="text",
        meta={
            "variant": variant,
            "role": "collapsed" if collapsed else "censored",
            "export_x": [variant] * len(chosen),
            "export_y": steps,
            **({} if labels is None else {"export_text": labels}),
        },
    )


def _mean_marks(variant: str, pos: int, summary: CollapseSummary, color: str) -> list[go.Scatter]:
    """A tall dash at the variant's mean collapse step, and its label under every
    seed's point of the row (so the two never overlap)."""
    return [
        go.Scatter(
            x=[summary.mean_step],
            y=[pos],
            mode="markers",
            name=f"{variant}: mean",
            legendgroup=variant,
            showlegend=False,
            marker={"symbol": "line-ns-open", "size": 26, "color": color, "line": {"width": 3}},
            text=[summary.label],
            hovertext=[f"{variant}: mean {summary.label} ({summary.count_label})"],
            hoverinfo="text",
            cliponaxis=False,
            meta={
                "variant": variant,
                "role": "mean",
                "export_x": [variant],
                "export_y": [summary.mean_step],
            },
        ),
        go.Scatter(
            x=[summary.mean_step],
            y=[pos + SEED_SPREAD + 0.17],
            mode="text",
            name=f"{variant}: mean label",
            legendgroup=variant,
            showlegend=False,
            text=[f"mean {summary.label}"],
            textposition="middle center",
            textfont={"color": color, "size": 10},
            hoverinfo="skip",
            cliponaxis=False,
            meta={"variant": variant, "role": "mean label", "export": False},
        ),
    ]


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
    fig.update_yaxes(tickformat=".0%")
    fig.update_layout(meta={"x_bounds": [0, None], "y_bounds": [0, 1]})
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
                    hovertemplate="censored (no collapse in its %{x} steps)<extra></extra>",
                    cliponaxis=False,
                    meta={"variant": variant, "role": "censored"},
                )
            )
    return fig


DOSE_ARM_SPREAD = 0.08  # sideways step between arms at one dose level (tick units)
DOSE_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star", "cross", "pentagon")


def dose_response(
    outcomes_by_variant: Mapping[str, Sequence[Outcome]],
    layout: Mapping[str, Any],
    *,
    colors: Mapping[str, str] | None = None,
    uirevision: str = "dose",
) -> go.Figure:
    """Share of seeds collapsed per rollout precision (the dose), one line per arm.

    ``layout``: ``dashboard.charts.stability_stats.dose_layout`` of the variants. Hover
    shows collapsed / seeds, so a cell with few seeds reads as such. Arms share
    values often (every arm at 0% is the common case), so each arm sits at its
    own small sideways offset from the level's tick, with its own marker
    symbol: no point hides another.
    """
    fig = go.Figure(
        layout=base_layout(
            title="Dose-response: collapsed seeds per rollout precision",
            x_title="rollout precision (fp32: no engine gap)",
            y_title="seeds collapsed",
            uirevision=uirevision,
        )
    )
    fig.update_yaxes(tickformat=".0%")
    fig.update_layout(meta={"y_bounds": [0, 1]})
    levels = list(layout["levels"])
    arms = list(layout["arms"].items())
    for index, (arm, by_level) in enumerate(arms):
        offset = (index - (len(arms) - 1) / 2) * min(DOSE_ARM_SPREAD, 0.6 / max(len(arms), 1))
        xs, ys, text = [], [], []
        for position, level in enumerate(levels):
            events = _events(outcomes_by_variant.get(by_level.get(level, ""), []))
            if not events:
                continue
            collapsed = sum(1 for e in events if e[1])
            xs.append(position + offset)
            ys.append(collapsed / len(events))
            text.append(f"{level}: {collapsed}/{len(events)}")
        if xs:
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    text=text,
                    mode="lines+markers",
                    name=arm,
                    line={"color": color_of(arm, colors)},
                    marker={"symbol": DOSE_SYMBOLS[index % len(DOSE_SYMBOLS)], "size": 9},
                    hovertemplate=f"{arm}<br>%{{text}} collapsed<extra></extra>",
                    cliponaxis=False,
                    meta={"variant": arm, "role": "dose"},
                )
            )
    fig.update_xaxes(
        tickmode="array",
        tickvals=list(range(len(levels))),
        ticktext=levels,
        range=[-0.5, len(levels) - 0.5],
    )
    return fig
