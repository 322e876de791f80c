"""The causal study's report: the pre-registered analysis of a study folder.

``causal_report(study, out)`` reads every finished run of the study (judged by
the collapse rule as fixed in the pre-registration, ``trainer.analysis.collapse.rejudge_collapse``),
and writes ``causal.json`` and ``causal.md`` into the study folder:

* per cell: runs, collapses, the routing gap and k3 at the start, the
  estimator's health (sequence chi-square and ESS), held-out accuracy at the
  start and end with t intervals (BCa where n >= 3), the change;
* the dose model (hazard ratio per 10 points of routing gap, with and
  without R3), the architecture contrast at zero gap, the time-varying
  lead-lag model; the three pre-registered p-values Holm-adjusted;
* the decision, by the rule written before any primary run.

    python -m trainer causal-report --study causal --out docs/results/causal/runs
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from trainer import metric_keys as K
from trainer.analysis.causal_markdown import markdown
from trainer.analysis.clustered import linear_effect, paired_contrast
from trainer.analysis.collapse import rejudge_collapse
from trainer.analysis.intervals import bca_interval, holm, t_interval
from trainer.analysis.run_record import RunRecord
from trainer.analysis.survival import (
    GAP_UNIT,
    architecture_model,
    dose_model,
    lead_lag_model,
    run_table,
)
from trainer.devices.environment import group_environments
from trainer.run_folder.files import SUMMARY_FILE, read_metrics, run_succeeded

ALPHA = 0.05
START_STEPS = 10  # "at the start": the mean over a run's first steps


def load_runs(study, out: Path) -> list[RunRecord]:
    """Every finished run of the study under ``out``, with its covariates and metrics.
    ``study``: a ``trainer.studies.definition.StudyDefinition`` (variants, seeds, config_for, base_of)."""
    runs = []
    for variant in study.variants:
        for seed in study.seeds:
            run_dir = out / variant.name / f"seed{seed}"
            if not run_succeeded(run_dir):
                continue
            cfg = study.config_for(variant, seed)
            rows = read_metrics(run_dir)
            summary = rejudge_collapse(cfg, json.loads((run_dir / SUMMARY_FILE).read_text()), rows)
            runs.append(
                RunRecord.of(
                    cfg, summary, variant=variant.name, base=study.base_of(seed), rows=rows
                )
            )
    return runs


def _mean_of(rows: list[dict], key: str, steps: slice) -> float | None:
    values = [r[key] for r in rows[steps] if r.get(key) is not None and math.isfinite(r[key])]
    return statistics.fmean(values) if values else None


def endpoint_key(rows: list[dict]) -> str:
    """The learning endpoint's metric: held-out accuracy without the engine's gap
    (``eval/accuracy_clean``) where the run logged it; runs from before it existed
    (the causal study's) have only the engine's figure, ``eval/accuracy``."""
    return (
        K.EVAL_ACCURACY_CLEAN if any(K.EVAL_ACCURACY_CLEAN in r for r in rows) else K.EVAL_ACCURACY
    )


def _eval_points(rows: list[dict], key: str | None = None) -> list[float]:
    key = key or endpoint_key(rows)
    return [r[key] for r in rows if r.get(key) is not None]


def heldout_change(run: RunRecord, key: str | None = None) -> float | None:
    """A run's held-out accuracy at its last evaluation minus at its first (the
    learning endpoint unless ``key`` names another series)."""
    points = _eval_points(run.rows, key)
    return points[-1] - points[0] if points else None


def cell_table(runs: list[RunRecord]) -> dict[str, dict[str, Any]]:
    cells: dict[str, list[RunRecord]] = {}
    for run in runs:
        cells.setdefault(run.variant, []).append(run)
    table = {}
    for name, members in cells.items():
        first = [_eval_points(r.rows)[0] for r in members if _eval_points(r.rows)]
        last = [_eval_points(r.rows)[-1] for r in members if _eval_points(r.rows)]
        change = [c for r in members if (c := heldout_change(r)) is not None]
        start = slice(0, START_STEPS)

        def mean(key: str, steps: slice = start, members=members) -> float | None:
            values = [_mean_of(r.rows, key, steps) for r in members]
            values = [v for v in values if v is not None]
            return statistics.fmean(values) if values else None

        table[name] = {
            "name": name,
            "runs": len(members),
            "bases": sorted({r.base for r in members}),
            "collapsed": sum(r.collapsed for r in members),
            "collapse_steps": sorted(r.collapse_step for r in members if r.collapsed),
            "sigma": members[0].sigma,
            "routing_gap": statistics.fmean(r.gap for r in members),
            "kl_k3": mean(K.MISMATCH_KL_K3),
            "chi2_seq": mean(K.IS_CHI2_SEQ),
            "ess_seq": mean(K.IS_ESS_SEQ),
            "response_tokens": mean(K.RESPONSE_LENGTH_MEAN),
            # The clip share of each step's first minibatch over the whole run: what the
            # clip spends on the engine gap alone (0 with recomputed behaviour log-probs).
            "clip_first": mean(K.POLICY_CLIP_FRAC_FIRST, slice(None)),
            # Over the whole run: the clip share of every minibatch, and the shares of
            # tokens the IS correction truncates (TIS) or masks (MIS, IcePop).
            "clip": mean(K.POLICY_CLIP_FRAC, slice(None)),
            "is_truncated": mean(K.TIS_CLIP_FRAC, slice(None)),
            "is_masked": mean(K.TIS_MASKED_FRAC, slice(None)),
            "heldout_start": statistics.fmean(first) if first else None,
            "heldout_end": statistics.fmean(last) if last else None,
            "heldout_change": statistics.fmean(change) if change else None,
            "heldout_change_t": t_interval(change),
            "heldout_change_bca": bca_interval(change) if len(change) >= 3 else None,
            "improved": sum(c > 0 for c in change),
            "endpoint": endpoint_key(members[0].rows),
            # The rollout engine's figure beside the endpoint (its gap included).
            "heldout_engine_change": _mean_or_none(
                [c for r in members if (c := heldout_change(r, K.EVAL_ACCURACY)) is not None]
            ),
        }
    return table


def _mean_or_none(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def paired_contrasts(runs: list[RunRecord], reference: str | None) -> dict[str, dict[str, Any]]:
    """Each cell's held-out change against the ``reference`` cell's on the same seed
    (so the same base): the mean of the per-seed differences with its t interval,
    over the seeds both cells finished."""
    if reference is None:
        return {}
    changes: dict[str, dict[int, float]] = {}
    bases = {run.seed: run.base for run in runs}
    for run in runs:
        change = heldout_change(run)
        if change is not None:
            changes.setdefault(run.variant, {})[run.seed] = change
    base = changes.get(reference, {})
    out = {}
    for name, by_seed in changes.items():
        if name == reference:
            continue
        seeds = sorted(by_seed.keys() & base.keys())
        diffs = [by_seed[s] - base[s] for s in seeds]
        if diffs:
            out[name] = {
                "pairs": len(diffs),
                "mean": statistics.fmean(diffs),
                "t": t_interval(diffs),
            }
            if seeds and all(s in bases for s in seeds) and len({bases[s] for s in seeds}) >= 2:
                clustered = paired_contrast(diffs, [bases[s] for s in seeds])
                out[name].update({k: clustered[k] for k in CLUSTERED_KEYS if k in clustered})
    return out


CLUSTERED_KEYS = ("bases", "cluster_base", "wild_cluster", "bases_positive")


def replay_contrasts(runs: list[RunRecord]) -> dict[str, dict[str, Any]]:
    """Each MoE+R3 cell against the MoE cell without replay at the same router noise and
    rollout precision, paired by seed (so by base), with base-clustered inference (``paired_contrasts``)."""
    cells: dict[tuple[bool, float, str], str] = {}
    for run in runs:
        if run.moe:
            key = (run.r3, run.sigma, run.precision)
            cells.setdefault(key, run.variant)
    out = {}
    for (r3, sigma, precision), name in cells.items():
        partner = cells.get((False, sigma, precision))
        if r3 and partner is not None:
            pair = [r for r in runs if r.variant in (name, partner)]
            contrast = paired_contrasts(pair, partner).get(name)
            if contrast:
                out[name] = {"against": partner, **contrast}
    return out


def collapse_rate_bound(collapsed: int, runs: int, level: float = 0.95) -> float | None:
    """One-sided Clopper-Pearson upper bound on a collapse probability (exact binomial):
    the largest rate under which ``collapsed`` or fewer events in ``runs`` has
    probability >= 1 - level. 0 of 12 gives 0.221, 0 of 36 gives 0.080."""
    from scipy import stats

    if runs == 0:
        return None
    if collapsed >= runs:
        return 1.0
    return float(stats.beta.ppf(level, collapsed + 1, runs - collapsed))


def learning_slope(runs: list[RunRecord]) -> dict[str, Any] | None:
    """Held-out accuracy change (first to last evaluation) against the routing gap
    (per 10 points) over the MoE runs without replay, under every inference of
    ``trainer.analysis.clustered.linear_effect``: plain least squares (the
    amendment's registered secondary outcome), base and seed fixed effects,
    cluster-robust by base, and the wild-cluster bootstrap by base. The plain
    fit's slope, interval and p stay at the top level as registered."""
    import pandas as pd

    records = []
    for run in runs:
        points = _eval_points(run.rows)
        if len(points) >= 2:
            records.append(
                {
                    "gap10": run.gap / GAP_UNIT,
                    "change": points[-1] - points[0],
                    "base": run.base,
                    "seed": run.seed,
                }
            )
    frame = pd.DataFrame.from_records(records)
    if len(frame) < 3 or frame["gap10"].nunique() < 2:
        return None
    effect = linear_effect(frame, "change", "gap10") if frame["base"].nunique() >= 2 else None
    from scipy import stats

    fit = stats.linregress(frame["gap10"], frame["change"])
    half = stats.t.ppf(0.975, len(frame) - 2) * fit.stderr
    return {
        "runs": len(frame),
        "slope": float(fit.slope),
        "low": float(fit.slope - half),
        "high": float(fit.slope + half),
        "p": float(fit.pvalue),
        "clustered": effect,
    }


def decide(dose: dict | None, adjusted: dict[str, float | None], pooled: dict | None = None) -> str:
    """The decision rule of the pre-registration (docs/results.md), applied as written,
    with its amendment for a study in which no MoE run collapses."""
    if dose is None:
        if pooled and pooled["runs"] and pooled["collapsed"] == 0:
            return (
                f"no collapse at any routing gap: 0 of {pooled['runs']} MoE runs without "
                "replay collapsed at a non-zero gap, so the collapse probability within the "
                f"run is below {100 * pooled['collapse_rate_upper95']:.0f}% at 95% (exact "
                "binomial); no hazard ratio can be estimated without events"
            )
        return "no decision: the dose model could not be fitted (no collapses among MoE runs)"
    gap = dose["gap"]
    h1 = adjusted.get("H1")
    if h1 is not None and h1 < ALPHA and gap["hr"] > 1:
        h2 = adjusted.get("H2")
        if h2 is not None and h2 < ALPHA and dose["r3_interaction"]["hr"] < 1:
            return (
                "mismatch-driven MoE collapse that R3 removes: the collapse hazard rises "
                f"{gap['hr']:.2f}x per 10 points of routing gap (95% CI {gap['hr_low']:.2f}-"
                f"{gap['hr_high']:.2f}), and the rise is smaller with R3"
            )
        return (
            f"mismatch-driven MoE collapse ({gap['hr']:.2f}x per 10 points of routing gap, "
            f"95% CI {gap['hr_low']:.2f}-{gap['hr_high']:.2f}); R3's effect on the rise is not "
            "established"
        )
    return (
        "no mismatch-driven collapse detected: the hazard ratio per 10 points of routing gap "
        f"is {gap['hr']:.2f}, below {gap['hr_high']:.2f} at 95% (upper bound of its interval)"
    )


def causal_report(study, out: Path) -> dict[str, Any]:
    runs = load_runs(study, out)
    frame = run_table(runs)
    dose = dose_model(frame) if len(frame) else None
    arch = architecture_model(frame) if len(frame) else None
    no_replay_moe = [r for r in runs if r.moe and not r.r3]
    lead_lag = lead_lag_model(no_replay_moe) if no_replay_moe else None
    raw = {
        "H1": None if dose is None else dose["gap"]["p"],
        "H2": None if dose is None or "r3_interaction" not in dose else dose["r3_interaction"]["p"],
        "H3": None if arch is None else arch["moe"]["p"],
    }
    present = [k for k, v in raw.items() if v is not None]
    adjusted_values = holm([raw[k] for k in present]) if present else []
    adjusted = {k: None for k in raw} | dict(zip(present, adjusted_values, strict=True))
    cells = cell_table(runs)
    for cell in cells.values():
        cell["collapse_rate_upper95"] = collapse_rate_bound(cell["collapsed"], cell["runs"])
        # If collapse proneness belongs to the base, the independent units are the bases:
        # the bound over bases with no collapsed run (0 of 4 bases: 53%).
        collapsed_bases = len({r.base for r in runs if r.variant == cell["name"] and r.collapsed})
        cell["bases_collapsed"] = collapsed_bases
        cell["collapse_rate_upper95_by_base"] = collapse_rate_bound(
            collapsed_bases, len(cell["bases"])
        )
    dosed = [r for r in no_replay_moe if r.sigma > 0]
    pooled = {
        "runs": len(dosed),
        "collapsed": sum(r.collapsed for r in dosed),
    }
    pooled["collapse_rate_upper95"] = collapse_rate_bound(pooled["collapsed"], pooled["runs"])
    report = {
        "runs": len(runs),
        "cells": cells,
        "dosed_moe_pooled": pooled,
        "learning_slope": learning_slope(no_replay_moe),
        "reference": getattr(study, "reference", None),
        "against_reference": paired_contrasts(runs, getattr(study, "reference", None)),
        "replay_contrasts": replay_contrasts(runs),
        "dose_model": dose,
        "architecture_model": arch,
        "lead_lag_model": lead_lag,
        "p_raw": raw,
        "p_holm": adjusted,
        "decision": decide(dose, adjusted, pooled),
        "registration": getattr(study, "analysis", None) or "causal",
        "per_run": frame.to_dict(orient="records") if len(frame) else [],
        "environments": group_environments(
            [(f"{r.variant}/seed{r.seed}", r.environment) for r in runs]
        ),
    }
    if report["registration"] == "edge":  # the near-edge study's own registered tests
        from trainer.analysis.edge_tests import decide_edge, edge_tests

        controls = [r for r in no_replay_moe if r.sigma == 0]
        report["registered"] = edge_tests(frame) if len(frame) else {}
        report["decision"] = decide_edge(
            report["registered"],
            sum(r.collapsed for r in controls),
            len(controls),
        )
    (out / "causal.json").write_text(json.dumps(report, indent=1, default=float))
    (out / "causal.md").write_text(markdown(report) + "\n")
    if runs:
        write_figure(runs, out / "causal_dose_response.png")
    return report


ARMS = (("MoE", "#1f77b4"), ("MoE+R3", "#2ca02c"), ("dense", "#7f7f7f"))


def _arm(run: RunRecord) -> str:
    if not run.moe:
        return "dense"
    return "MoE+R3" if run.r3 else "MoE"


def write_figure(runs: list[RunRecord], path: Path) -> Path:
    """Two panels against each run's routing gap (x, % of (token, layer) pairs):
    its time to collapse (filled: collapsed; open: censored at its last step)
    and its held-out accuracy change from the first to the last evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for arm, color in ARMS:
        members = [r for r in runs if _arm(r) == arm]
        if not members:
            continue
        gaps = [100 * r.gap for r in members]
        times = [r.time for r in members]
        events = [r.collapsed for r in members]
        # Runs at one gap (all zero-gap runs) would hide each other: a small fixed
        # horizontal spread, named on the axis.
        gaps = [g + 0.25 * ((i % 5) - 2) for i, g in enumerate(gaps)]
        for filled, label in ((True, "collapsed"), (False, "censored")):
            xs = [g for g, e in zip(gaps, events, strict=True) if e == filled]
            ys = [t for t, e in zip(times, events, strict=True) if e == filled]
            if xs:
                style = {"color": color} if filled else {"facecolors": "none", "edgecolors": color}
                left.scatter(xs, ys, label=f"{arm}, {label}", **style)
        changes = []
        for r in members:
            points = _eval_points(r.rows)
            changes.append(points[-1] - points[0] if len(points) >= 2 else float("nan"))
        right.scatter(gaps, changes, color=color, label=arm, alpha=0.8)
    xlabel = "routing gap at the start (% of token-layer pairs; spread +-0.5 to show overlaps)"
    left.set_xlabel(xlabel)
    left.set_ylabel("time to collapse (steps; open = never, censored)")
    left.set_ylim(0, max(r.steps for r in runs) * 1.05)
    left.legend(fontsize=8, loc="lower left")
    right.axhline(0.0, color="black", linewidth=0.8)
    right.set_xlabel(xlabel)
    right.set_ylabel("held-out accuracy change, first to last evaluation")
    right.legend(fontsize=8)
    fig.suptitle(f"Causal study: {len(runs)} runs")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
