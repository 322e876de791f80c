"""A study's results: per-variant tables from its run folders, survival statistics,
the dose-response fit, and the markdown report (``write_report``).

Collapse steps are censored: a run that never collapsed counts as surviving to
its last step, and a variant with any such seed shows ">= N" (a lower bound),
never an average that pretends those runs collapsed.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from trainer import metric_keys as K
from trainer.analysis.collapse import CollapseSummary, rejudge_collapse, summarize_collapses
from trainer.devices.environment import environments_line, group_environments
from trainer.run_folder.files import SUMMARY_FILE, read_metrics, run_succeeded
from trainer.studies.definition import StudyDefinition

# A k3 spike: a step whose k3 is this many times the run's own median k3 (an
# order-of-magnitude excursion, what the KL traces of the R3 paper show as spikes).
K3_SPIKE_FACTOR = 10.0


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(values) if values else None


def collect_results(study: StudyDefinition, out: Path) -> dict[str, Any]:
    variants = {}
    machines: list[tuple[str, dict | None]] = []
    for variant in study.variants:
        seeds = []
        for seed in study.seeds:
            run_dir = out / variant.name / f"seed{seed}"
            if not run_succeeded(run_dir):  # a run stopped part-way is not a seed (it resumes)
                continue
            summary = json.loads((run_dir / SUMMARY_FILE).read_text())
            machines.append((f"{variant.name}/seed{seed}", summary.get("environment")))
            rows = read_metrics(run_dir)
            summary = rejudge_collapse(study.config_for(variant, seed), summary, rows)
            seeds.append(
                {
                    "seed": seed,
                    "summary": summary,
                    "kl_k3": _mean([r.get(K.MISMATCH_KL_K3) for r in rows]),
                    **k3_profile([r.get(K.MISMATCH_KL_K3) for r in rows]),
                    "kl_k3_max": max(
                        (r[K.MISMATCH_KL_K3_MAX] for r in rows if r.get(K.MISMATCH_KL_K3_MAX)),
                        default=None,
                    ),
                    "routing": _mean([r.get(K.MISMATCH_ROUTING_INCONSISTENCY) for r in rows]),
                    "extreme": _mean([r.get(K.MISMATCH_EXTREME_TOKEN_FRAC) for r in rows]),
                    "step_s": _mean([r.get(K.TIME_STEP_S) for r in rows]),
                    "series": {
                        key: [[r["step"], r.get(key)] for r in rows]
                        for key in (
                            K.MISMATCH_KL_K3,
                            K.MISMATCH_ROUTING_INCONSISTENCY,
                            K.REWARD_ACCURACY,
                            K.EVAL_ACCURACY,
                            K.POLICY_ENTROPY,
                            K.POLICY_GRAD_NORM,
                        )
                    },
                }
            )
        variants[variant.name] = {"seeds": seeds, "row": table_row(seeds)}
    results = {"study": study.name, "seeds": study.seeds, "variants": variants}
    # The machines the runs ran on (a CPU base's bits depend on the CPU).
    results["environments"] = group_environments(machines)
    results["statistics"] = study_statistics(study, results, out)
    return results


def k3_profile(per_step: list[float | None]) -> dict[str, Any]:
    """A run's per-step k3 (one value per step, None where not measured) ->
    its median and its spikes: steps above ``K3_SPIKE_FACTOR`` x that median."""
    values = [v for v in per_step if v is not None and math.isfinite(v)]
    if not values:
        return {"kl_k3_median": None, "kl_k3_spikes": None, "kl_k3_steps": 0}
    median = statistics.median(values)
    spikes = sum(v > K3_SPIKE_FACTOR * median for v in values) if median > 0 else 0
    return {"kl_k3_median": median, "kl_k3_spikes": spikes, "kl_k3_steps": len(values)}


def _reference(study: StudyDefinition) -> str:
    names = [v.name for v in study.variants]
    if study.reference:
        return study.reference
    return "moe-grpo" if "moe-grpo" in names else names[0]


def _times_events(seeds: list[dict]) -> tuple[list[int], list[bool]]:
    times = [
        s["summary"]["collapse_step"] if s["summary"]["collapsed"] else s["summary"]["steps"]
        for s in seeds
    ]
    return [int(t) for t in times], [bool(s["summary"]["collapsed"]) for s in seeds]


def study_statistics(study: StudyDefinition, results: dict[str, Any], out: Path) -> dict[str, Any]:
    """Survival per variant, log-rank vs the reference, CIs, lead-lag, dose-response."""
    from trainer.analysis.intervals import mean_ci
    from trainer.analysis.kaplan_meier import kaplan_meier, log_rank, median_survival
    from trainer.analysis.lead_lag import lead_lag_table

    reference = _reference(study)
    ref_t, ref_e = _times_events(results["variants"].get(reference, {}).get("seeds", []))
    per_variant: dict[str, Any] = {}
    for name, data in results["variants"].items():
        seeds = data["seeds"]
        if not seeds:
            continue
        times, events = _times_events(seeds)
        median = median_survival(times, events)
        test = log_rank(times, events, ref_t, ref_e) if name != reference and ref_t else None
        per_variant[name] = {
            "runs": len(seeds),
            "collapsed": sum(events),
            "km": [[p.time, p.survival, p.at_risk, p.events] for p in kaplan_meier(times, events)],
            "last_step": max(times),
            "median": median.median,
            "median_low": median.low,
            "median_high": median.high,
            "logrank_chi2": None if test is None else test.chi2,
            "logrank_p": None if test is None else test.p_value,
            "kl_k3_ci": mean_ci([s["kl_k3"] for s in seeds]),
            "kl_k3_median_ci": mean_ci([s.get("kl_k3_median") for s in seeds]),
            "kl_k3_spikes_per_100": _spike_rate(seeds),
            "routing_ci": mean_ci([s["routing"] for s in seeds]),
            "final_accuracy_ci": mean_ci([s["summary"].get("final_accuracy") for s in seeds]),
            "step_s_ci": mean_ci([s["step_s"] for s in seeds]),
        }
    runs = []
    for name, data in results["variants"].items():
        for seed in data["seeds"]:
            summary = seed["summary"]
            runs.append(
                {
                    "rows": read_metrics(out / name / f"seed{seed['seed']}"),
                    "collapsed": summary["collapsed"],
                    "collapse_step": summary["collapse_step"],
                }
            )
    lead_lag = [
        row.__dict__
        for row in lead_lag_table(runs, [K.MISMATCH_KL_K3, K.MISMATCH_ROUTING_INCONSISTENCY])
    ]
    return {
        "reference": reference,
        "variants": per_variant,
        "lead_lag": lead_lag,
        "dose": dose_response(study, per_variant),
    }


def _spike_rate(seeds: list[dict]) -> float | None:
    steps = sum(s.get("kl_k3_steps") or 0 for s in seeds)
    return None if not steps else 100.0 * sum(s.get("kl_k3_spikes") or 0 for s in seeds) / steps


def dose_response(study: StudyDefinition, per_variant: dict[str, Any]) -> dict[str, Any] | None:
    """Per arm and level: collapsed / runs and the mean k3 with its 95% CI (BCa)."""
    if not study.dose:
        return None
    levels, arms = study.dose["levels"], study.dose["arms"]
    cells = {}
    for arm in arms:
        cells[arm] = []
        for level in levels:
            stats = per_variant.get(f"{arm}-{level}")
            cells[arm].append(
                None
                if stats is None
                else {
                    "level": level,
                    "runs": stats["runs"],
                    "collapsed": stats["collapsed"],
                    "kl_k3_ci": stats["kl_k3_ci"],
                    "median": stats["median"],
                }
            )
    return {"axis": study.dose.get("axis"), "levels": levels, "arms": cells}


def censored_collapse(summaries: list[dict]) -> CollapseSummary:
    """Collapse summary over seeds from run summaries (censored at the last step)."""
    return summarize_collapses(
        (s["collapse_step"] if s["collapsed"] else s["steps"], s["collapsed"]) for s in summaries
    )


def table_row(seeds: list[dict]) -> dict[str, Any]:
    summaries = [s["summary"] for s in seeds]
    collapse = censored_collapse(summaries)
    return {
        "kl_k3_x1e3": _scaled(_mean([s["kl_k3"] for s in seeds]), 1e3),
        "kl_k3_max_x1e3": _scaled(_mean([s["kl_k3_max"] for s in seeds]), 1e3),
        "routing_pct": _scaled(_mean([s["routing"] for s in seeds]), 100),
        "extreme_pct": _scaled(_mean([s["extreme"] for s in seeds]), 100),
        "collapse_step": collapse.label,
        "collapsed": f"{collapse.collapsed}/{collapse.runs}",
        "initial_accuracy": _mean([s.get("initial_accuracy") for s in summaries]),
        "final_accuracy": _mean([s.get("final_accuracy") for s in summaries]),
        "best_accuracy": _mean([s.get("best_accuracy") for s in summaries]),
        "step_s": _mean([s["step_s"] for s in seeds]),
    }


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown_table(results: dict[str, Any]) -> str:
    head = (
        "| variant | KL k3 (x1e-3) | max seq k3 (x1e-3) | routing inconsistency % | "
        "extreme tokens % | collapse step | collapsed | accuracy start | final | best | "
        "step s |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, data in results["variants"].items():
        r = data["row"]
        lines.append(
            f"| {name} | {_cell(r['kl_k3_x1e3'], '.3f')} | {_cell(r['kl_k3_max_x1e3'], '.2f')} | "
            f"{_cell(r['routing_pct'], '.2f')} | {_cell(r['extreme_pct'], '.2f')} | "
            f"{r['collapse_step']} | {r['collapsed']} | {_cell(r['initial_accuracy'], '.3f')} | "
            f"{_cell(r['final_accuracy'], '.3f')} | {_cell(r['best_accuracy'], '.3f')} | "
            f"{_cell(r['step_s'], '.2f')} |"
        )
    return "\n".join(lines)


def _ci_cell(ci: Any, scale: float, fmt: str) -> str:
    if not ci:
        return "-"
    mean, lo, hi = (v * scale for v in ci)
    return f"{mean:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def _median_cell(stats: dict[str, Any]) -> str:
    if stats["median"] is None:
        return f"not reached (> {stats['last_step']})"
    high = "open" if stats["median_high"] is None else stats["median_high"]
    low = "-" if stats["median_low"] is None else stats["median_low"]
    return f"{stats['median']} [{low}, {high}]"


def statistics_table(results: dict[str, Any]) -> str:
    """Survival, log-rank and 95% CIs (BCa) per variant (markdown)."""
    st = results["statistics"]
    head = (
        f"| variant | collapsed | median time-to-collapse [95% CI] | log-rank p vs "
        f"{st['reference']} | KL k3 x1e-3 [95% CI] | routing % [95% CI] | "
        "held-out accuracy [95% CI] | step s |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, v in st["variants"].items():
        p = "-" if v["logrank_p"] is None else f"{v['logrank_p']:.3g}"
        lines.append(
            f"| {name} | {v['collapsed']}/{v['runs']} | {_median_cell(v)} | {p} | "
            f"{_ci_cell(v['kl_k3_ci'], 1e3, '.3f')} | {_ci_cell(v['routing_ci'], 100, '.2f')} | "
            f"{_ci_cell(v['final_accuracy_ci'], 1, '.3f')} | "
            f"{_ci_cell(v['step_s_ci'], 1, '.2f')} |"
        )
    return "\n".join(lines)


def kl_table(results: dict[str, Any]) -> str:
    """The KL gap per variant: the mean over runs of each run's mean and median
    per-step k3 (95% BCa CIs over runs) and k3 spikes per 100 steps."""
    head = (
        "| variant | runs | mean k3 x1e-3 [95% CI] | median k3 x1e-3 [95% CI] | "
        f"spikes (> {K3_SPIKE_FACTOR:g}x the run's median) per 100 steps |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, v in results["statistics"]["variants"].items():
        rate = v.get("kl_k3_spikes_per_100")
        lines.append(
            f"| {name} | {v['runs']} | {_ci_cell(v['kl_k3_ci'], 1e3, '.3f')} | "
            f"{_ci_cell(v.get('kl_k3_median_ci'), 1e3, '.3f')} | {_cell(rate, '.2f')} |"
        )
    return "\n".join(lines)


def lead_lag_markdown(results: dict[str, Any]) -> str:
    head = (
        "| signal | collapsed runs | rose | rose before the drop | median lead (steps) | "
        "leads | non-collapsed runs that rose anyway |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in results["statistics"]["lead_lag"]:
        lead = "-" if row["median_lead"] is None else f"{row['median_lead']:g}"
        lines.append(
            f"| {row['signal']} | {row['collapsed_runs']} | {row['rose']} | "
            f"{row['rose_before']} | {lead} | {row['leads']} | "
            f"{row['control_rose']}/{row['control_runs']} |"
        )
    return "\n".join(lines)


def write_report(study: StudyDefinition, results: dict[str, Any], out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=1))
    table = markdown_table(results) + "\n\n" + environments_line(results.get("environments", []))
    if results.get("statistics"):
        table += "\n\n" + statistics_table(results) + "\n\n" + kl_table(results)
        table += "\n\n" + lead_lag_markdown(results)
    (out / "table.md").write_text(table + "\n")
    print()
    print(table)
    try:
        from trainer.studies.figures import write_figures

        for path in write_figures(results, out):
            print(f"figure: {path}")
    except ImportError as exc:  # matplotlib missing: the table still stands
        print(f"figures skipped: {exc}")
