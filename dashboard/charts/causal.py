"""The stability review's causal panel: collapse hazard against the routing gap.

Pure (no Django): run records in, table rows and a Plotly figure out. The
statistics are the causal study's (``trainer.analysis.survival``: the Cox dose
model stratified by base, the MoE-vs-dense contrast at zero gap, Holm over
the three tests) and the power statement is Schoenfeld's
(``trainer.analysis.power.detectable_hazard_ratio``) on the events observed.

A run record: ``variant``, ``seed``, ``base`` (the warm-start seed), ``moe``,
``r3``, ``gap`` (the share of (token, MoE layer) pairs routed differently over
the run's first steps), ``summary`` (``collapsed``, ``collapse_step``, ``steps``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from dashboard.charts.figures.collapse import add_outcome_key
from dashboard.charts.style import base_layout, color_of
from trainer.analysis.run_record import RunRecord

MIN_GAP_SPREAD = 0.01  # a panel needs MoE runs at (at least) two gaps a point apart


@dataclass(frozen=True)
class EffectRow:
    test: str
    hazard_ratio: str
    p_holm: str


def applies(records: Sequence[RunRecord]) -> bool:
    """The panel is shown when the MoE runs span a routing gap (a dose)."""
    gaps = [r.gap for r in records if r.moe]
    return len(gaps) >= 2 and max(gaps) - min(gaps) >= MIN_GAP_SPREAD


# A fitted hazard ratio past these, or an interval spanning more than DEGENERATE_SPAN,
# is a fit that ran off (complete or quasi-complete separation: every collapse in
# one group), not an estimate: it is said in words, and its p-value left out of Holm.
DEGENERATE_HR = 1e4
DEGENERATE_SPAN = 1e6
NOT_ESTIMABLE = (
    "not estimable: the collapses fall in one group only (separation), so the fit "
    "has no finite hazard ratio"
)


def degenerate(effect: dict[str, float] | None) -> bool:
    """The fit gave no usable estimate (see DEGENERATE_HR)."""
    if not effect:
        return False
    values = [effect["hr"], effect["hr_low"], effect["hr_high"]]
    if not all(math.isfinite(v) for v in values) or min(values) <= 0:
        return True
    hr, low, high = values
    return not (1 / DEGENERATE_HR < hr < DEGENERATE_HR) or high / low > DEGENERATE_SPAN


def _hr(effect: dict[str, float] | None) -> str:
    if not effect:
        return "-"
    if degenerate(effect):
        return NOT_ESTIMABLE
    return (
        f"{effect['hr']:.2f} [{effect['hr_low']:.2f}, {effect['hr_high']:.2f}], "
        f"p = {effect['p']:.3g}"
    )


def effects(records: Sequence[RunRecord]) -> dict[str, Any]:
    """Cox effects with Holm-adjusted p-values, exact bounds and the power statement."""
    from lifelines.exceptions import ConvergenceError

    from trainer.analysis.intervals import holm
    from trainer.analysis.power import detectable_hazard_ratio
    from trainer.analysis.survival import architecture_model, dose_model, run_table

    frame = run_table(records)
    try:
        dose = dose_model(frame)
    except (ConvergenceError, ValueError, ArithmeticError):
        dose = None  # no finite fit (e.g. complete separation): shown as not estimable
    try:
        arch = architecture_model(frame)
    except (ConvergenceError, ValueError, ArithmeticError):
        arch = None
    tested = {
        "H1": dose and dose["gap"],
        "H2": dose and dose.get("r3_interaction"),
        "H3": arch and arch["moe"],
    }
    raw = {k: None if not e or degenerate(e) else e["p"] for k, e in tested.items()}
    present = [k for k, v in raw.items() if v is not None]
    adjusted = dict(zip(present, holm([raw[k] for k in present]), strict=True))

    def p(key: str) -> str:
        return "-" if key not in adjusted else f"{adjusted[key]:.3g}"

    rows = [
        EffectRow("MoE hazard per 10 points of routing gap", _hr(dose and dose["gap"]), p("H1")),
        EffectRow("R3 x gap interaction", _hr(dose and dose.get("r3_interaction")), p("H2")),
        EffectRow("MoE+R3 hazard per 10 points of gap", _hr(dose and dose.get("gap_with_r3")), "-"),
        EffectRow("MoE vs dense at zero gap", _hr(arch and arch["moe"]), p("H3")),
    ]
    moe = frame[frame["moe"] == 1]
    events = int(moe["event"].sum())
    spread = float(moe["gap10"].std(ddof=0)) if len(moe) > 1 else 0.0
    detectable = detectable_hazard_ratio(events, spread)
    if detectable is None:
        power = (
            f"{events} collapses among {len(moe)} MoE runs: no hazard ratio can be estimated "
            "without collapses."
            if events == 0
            else "The MoE runs share one routing gap: no dose to test."
        )
    else:
        power = (
            f"With {events} collapses among {len(moe)} MoE runs and a gap spread (sd) of "
            f"{10 * spread:.1f} points, the smallest hazard ratio per 10 points detectable "
            f"with 80% power at alpha 0.05 is about {detectable:.2f} (Schoenfeld)."
        )
    return {"rows": rows, "power": power, "events": events, "moe_runs": len(moe)}


def gap_scatter(records: Sequence[RunRecord], colors: dict[str, str] | None = None) -> go.Figure:
    """Each run at its routing gap (x, %) and its time to collapse (y): filled when
    it collapsed, open when censored (its step count, the least its collapse step
    could be); one colour per variant, one legend entry per variant and a key to
    the two marks."""
    fig = go.Figure()
    by_variant: dict[str, list[RunRecord]] = {}
    for record in records:
        by_variant.setdefault(record.variant, []).append(record)
    for variant in sorted(by_variant):
        members = by_variant[variant]
        color = color_of(variant, colors)
        first = True
        for collapsed, symbol in ((True, "circle"), (False, "circle-open")):
            chosen = [m for m in members if m.collapsed == collapsed]
            if not chosen:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[100 * m.gap for m in chosen],
                    y=[m.time for m in chosen],
                    mode="markers",
                    marker={"color": color, "symbol": symbol, "size": 9},
                    name=variant,
                    legendgroup=variant,
                    showlegend=first,
                    text=[f"seed {m.seed}, base {m.base}" for m in chosen],
                    hovertemplate=(
                        f"{variant} ({'collapsed' if collapsed else 'censored'})<br>%{{text}}"
                        "<br>gap %{x:.1f}%<br>step %{y}<extra></extra>"
                    ),
                    cliponaxis=False,
                    meta={"variant": variant, "role": "collapsed" if collapsed else "censored"},
                )
            )
            first = False
    add_outcome_key(fig, "circle-open", size=9)
    layout = base_layout(
        title="Time to collapse against the routing gap",
        x_title="routing gap at the start (% of token-layer pairs)",
        y_title="collapse step, or steps run if censored",
        uirevision="causal-gap",
        hovermode="closest",
    )
    layout["meta"] = {"x_bounds": [0, 100], "y_bounds": [0, None]}
    fig.update_layout(**layout)
    return fig
