"""The causal report's markdown (``causal.md``): the cell table, the contrasts with
base-clustered inference, the pre-registered tests, the bounds and the decision.
Its numbers come from ``trainer.analysis.causal_report``; this module only writes them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainer.devices.environment import environments_line


def _hr(effect: dict | None) -> str:
    if not effect:
        return "-"
    return f"{effect['hr']:.2f} [{effect['hr_low']:.2f}, {effect['hr_high']:.2f}], p = {effect['p']:.3g}"


def _fmt(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _interval(ci: Sequence[float] | None) -> str:
    return "-" if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Runs analysed: {report['runs']}. " + environments_line(report.get("environments", [])),
        "",
        "| cell | sigma | runs (bases) | collapsed | collapse steps | routing gap % | k3 x1e-3 | "
        "chi2 seq | ESS seq | first-minibatch clip % | response tokens | held-out start -> end | "
        "change [t 95%] | change [BCa 95%] | improved | engine change |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in report["cells"].items():
        steps = ", ".join(str(s) for s in c["collapse_steps"]) or "-"
        k3 = None if c["kl_k3"] is None else 1e3 * c["kl_k3"]
        lines.append(
            f"| {name} | {c['sigma']:g} | {c['runs']} ({len(c['bases'])}) | {c['collapsed']} | "
            f"{steps} | {100 * c['routing_gap']:.2f} | {_fmt(k3, '.3f')} | "
            f"{_fmt(c['chi2_seq'], '.3f')} | {_fmt(c['ess_seq'], '.3f')} | "
            f"{_fmt(None if c['clip_first'] is None else 100 * c['clip_first'], '.2f')} | "
            f"{_fmt(c['response_tokens'], '.1f')} | {_fmt(c['heldout_start'], '.3f')} -> "
            f"{_fmt(c['heldout_end'], '.3f')} | {_interval(c['heldout_change_t'])} | "
            f"{_interval(c['heldout_change_bca'])} | {c['improved']}/{c['runs']} | "
            f"{_fmt(c.get('heldout_engine_change'), '+.3f')} |"
        )
    endpoints = {c.get("endpoint") for c in report["cells"].values()}
    lines += [
        "",
        "Held-out accuracy is the learning endpoint "
        + (
            "decoded without the engine's gap (eval/accuracy_clean); 'engine change' is the "
            "rollout engine's figure (eval/accuracy), its gap included."
            if endpoints == {"eval/accuracy_clean"}
            else "as decoded by the rollout engine (eval/accuracy: these runs predate the "
            "gap-free endpoint, so a noisy cell's figure includes its routing flips)."
        ),
    ]
    if report.get("against_reference"):
        lines += [
            "",
            f"Against the reference cell {report['reference']} on the same seeds and bases "
            "(held-out change, paired, t 95%), and the whole run's clip and IS shares:",
            "",
            "| cell | pairs (bases) | change vs reference [t 95%, independent] | "
            "[CRV1 by base, t(G-1) 95%] | wild-cluster bootstrap p | bases positive | "
            "policy clip % | IS truncated % | IS masked % |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, pair in report["against_reference"].items():
            c = report["cells"][name]
            shares = [
                None if c[k] is None else 100 * c[k] for k in ("clip", "is_truncated", "is_masked")
            ]
            lines.append(
                _contrast_cells(name, pair)
                + " "
                + " | ".join(_fmt(v, ".2f") for v in shares)
                + " |"
            )
    if report.get("replay_contrasts"):
        lines += [
            "",
            "R3 against no replay at the same router noise, paired by seed (post hoc in the "
            "causal study, which registered R3 only through the hazard interaction H2):",
            "",
            "| cell | pairs (bases) | change vs no replay [t 95%, independent] | "
            "[CRV1 by base, t(G-1) 95%] | wild-cluster bootstrap p | bases positive |",
            "|---|---|---|---|---|---|",
        ]
        for name, pair in report["replay_contrasts"].items():
            lines.append(_contrast_cells(f"{name} vs {pair['against']}", pair))
    dose, arch, ll = report["dose_model"], report["architecture_model"], report["lead_lag_model"]
    adj = report["p_holm"]
    if report.get("registration") == "edge":
        from trainer.analysis.edge_tests import edge_markdown

        lines += ["", *edge_markdown(report.get("registered", {}))]
    else:
        lines += _causal_tests(dose, arch, adj)
    if ll:
        lines += [
            "",
            f"Lead-lag (time-varying Cox, MoE without replay, lag {ll['lag']} steps, "
            f"{ll['events']} collapses over {ll['rows']} run-steps at risk): hazard ratio per "
            f"decade of lagged k3 {_hr(ll['k3_per_decade'])}; per 10 points of lagged routing "
            f"gap {_hr(ll['routing_per_10pct'])}.",
        ]
    pooled, slope = report["dosed_moe_pooled"], report["learning_slope"]
    bounds = ", ".join(
        f"{name} {c['collapsed']}/{c['runs']} < {100 * c['collapse_rate_upper95']:.0f}%"
        + (
            f" (by base {c['bases_collapsed']}/{len(c['bases'])} < "
            f"{100 * c['collapse_rate_upper95_by_base']:.0f}%)"
            if c.get("collapse_rate_upper95_by_base") is not None
            else ""
        )
        for name, c in report["cells"].items()
        if c.get("collapse_rate_upper95") is not None
    )
    lines += [
        "",
        f"Collapse probability within the run, per cell, one-sided 95% upper bounds (exact "
        f"binomial; by base: counting a base with any collapsed run as one event, the "
        f"bound if collapse proneness belongs to the base): "
        f"{bounds}; MoE without replay at any non-zero gap, pooled: {pooled['collapsed']} of "
        f"{pooled['runs']}, below "
        f"{_fmt(None if pooled['collapse_rate_upper95'] is None else 100 * pooled['collapse_rate_upper95'], '.0f')}%.",
    ]
    if slope:
        lines.append(
            f"Held-out accuracy change against the routing gap (MoE without replay, "
            f"{slope['runs']} runs): {slope['slope']:+.3f} per 10 points "
            f"[{slope['low']:+.3f}, {slope['high']:+.3f}], p = {slope['p']:.3g} (least squares, "
            "runs as independent)."
        )
        if slope.get("clustered"):
            lines += ["", *slope_table(slope["clustered"])]
    lines += ["", f"Decision (pre-registered rule): {report['decision']}."]
    return "\n".join(lines)


def _causal_tests(dose, arch, adj) -> list[str]:
    """The causal study's pre-registered tests (H1-H3) as a table."""
    return [
        "",
        "| pre-registered test | hazard ratio [95% CI], Wald p | Holm-adjusted p |",
        "|---|---|---|",
        f"| H1: MoE hazard per 10 points of routing gap (no replay) | "
        f"{_hr(dose and dose['gap'])} | {_fmt(adj['H1'], '.3g')} |",
        f"| H2: R3 x gap interaction | {_hr(dose and dose.get('r3_interaction'))} | "
        f"{_fmt(adj['H2'], '.3g')} |",
        f"| H3: MoE vs dense at zero gap | {_hr(arch and arch['moe'])} | {_fmt(adj['H3'], '.3g')} |",
        f"| (MoE+R3 hazard per 10 points of gap) | {_hr(dose and dose.get('gap_with_r3'))} | - |",
    ]


def _contrast_cells(name: str, pair: dict[str, Any]) -> str:
    """The first cells of a contrast row: independent t, CRV1 by base, wild p, signs."""
    cluster = pair.get("cluster_base")
    wild = pair.get("wild_cluster")
    crv1 = "-" if not cluster else _interval((cluster["low"], cluster["high"]))
    p = "-" if not wild else f"{wild['p']:.3f} ({wild['draws']} {wild['weights']})"
    signs = "-" if "bases_positive" not in pair else f"{pair['bases_positive']}/{pair['bases']}"
    return (
        f"| {name} | {pair['pairs']} ({pair.get('bases', '-')}) | {pair['mean']:+.3f} "
        f"{_interval(pair['t'])} | {crv1} | {p} | {signs} |"
    )


SLOPE_ROWS = (
    ("ols", "least squares, runs independent"),
    ("base_fe", "base fixed effects"),
    ("seed_fe", "seed fixed effects"),
    ("cluster_base", "cluster-robust by base (CRV1, t(G-1))"),
    ("base_fe_cluster", "base fixed effects, CRV1 by base"),
)


def slope_table(effect: dict[str, Any]) -> list[str]:
    """The slope under each inference (trainer.analysis.clustered.linear_effect)."""
    lines = [
        f"The same slope with the base as a cluster ({effect['runs']} runs on "
        f"{effect['bases']} bases):",
        "",
        "| inference | slope per 10 points | 95% interval | p |",
        "|---|---|---|---|",
    ]
    for key, label in SLOPE_ROWS:
        fit = effect[key]
        lines.append(
            f"| {label} | {fit['coef']:+.4f} | [{fit['low']:+.4f}, {fit['high']:+.4f}] | "
            f"{fit['p']:.3f} |"
        )
    wild = effect["wild_cluster"]
    how = "every weight vector" if wild["enumerated"] else "random weight vectors"
    lines.append(
        f"| wild-cluster bootstrap by base (base fixed effects, restricted, {wild['weights']} "
        f"weights, {wild['draws']} draws: {how}) | - | - | {wild['p']:.3f} |"
    )
    return lines
