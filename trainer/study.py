"""The stability study: variants x seeds, one table, the figures behind it.

A study definition is JSON (the platform runs the same definition as a sweep):

    {
      "name": "quick",
      "description": "...",
      "base": {"preset": "moe-grpo", "set": ["run.steps=60", ...]},
      "seeds": [0, 1, 2],
      "variants": [
        {"name": "dense-grpo", "set": ["model.n_experts=0"]},
        {"name": "moe-grpo-r3", "set": ["stabilizers.replay.mode=\\"r3\\""]}
      ]
    }

Each run's config = base preset + base ``set`` + the variant's ``set`` +
``run.seed``, and the same seed in every field of ``"seed_fields"`` (e.g.
``["warm_start.seed"]``: each seed then starts from its own independently
warm-started base, so the seeds replicate the base as well as the RL run;
with ``"bases": N`` the fields get ``seed % N`` instead, N bases shared by the
seeds in turn). Runs land in OUT/<variant>/seed<k>/; a finished run is not run
again, so an interrupted study continues where it stopped.

Collapse steps are censored: a run that never collapsed counts as surviving to
its last step, and a variant with any such seed shows ">= N" (a lower bound),
never an average that pretends those runs collapsed.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from trainer import metric_keys as K
from trainer.collapse import CollapseSummary, rejudge_collapse, summarize_collapses
from trainer.config import ExperimentConfig, apply_overrides
from trainer.errors import FieldError
from trainer.presets import preset_dict
from trainer.run_files import SUMMARY_FILE, read_metrics, run_succeeded
from trainer.validation import validate_config

# Every definition shipped in trainer/studies/ is a built-in study, by its file name.
BUILTIN_STUDIES = tuple(
    sorted(
        entry.name.removesuffix(".json")
        for entry in resources.files("trainer.studies").iterdir()
        if entry.name.endswith(".json")
    )
)
# A k3 spike: a step whose k3 is this many times the run's own median k3 (an
# order-of-magnitude excursion, what the KL traces of the R3 paper show as spikes).
K3_SPIKE_FACTOR = 10.0


@dataclass
class Variant:
    name: str
    overrides: list[str] = field(default_factory=list)


@dataclass
class StudyDefinition:
    name: str
    description: str
    base_preset: str
    base_overrides: list[str]
    seeds: list[int]
    variants: list[Variant]
    parallel: int = 2
    # The arm the log-rank tests compare with (default: moe-grpo when present, else the first).
    reference: str | None = None
    # Dose-response layout: {"axis": "rollout.precision", "levels": [...], "arms": [...]};
    # the variant of arm A at level L is named "A-L".
    dose: dict[str, Any] | None = None
    # Config fields that every seed also sets to the seed (see the module docstring).
    seed_fields: list[str] = field(default_factory=list)
    # With ``bases`` = N the seed fields get seed % N: seeds k, k + N, ... share base k,
    # so a cell's runs spread over N independently warm-started bases.
    bases: int | None = None
    # "causal": also write the pre-registered analysis (trainer.analysis.causal_report).
    analysis: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudyDefinition:
        def need(obj: dict, key: str, where: str):
            if key not in obj:
                raise FieldError([(f"{where}{key}", "required")])
            return obj[key]

        base = need(data, "base", "")
        variants = need(data, "variants", "")
        if not isinstance(variants, list) or not variants:
            raise FieldError([("variants", "give at least one variant")])
        names = [need(v, "name", f"variants.{i}.") for i, v in enumerate(variants)]
        if len(set(names)) != len(names):
            raise FieldError([("variants", "variant names must be unique")])
        seeds = data.get("seeds", [0, 1, 2])
        if not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
            raise FieldError([("seeds", "give a list of non-negative integer seeds")])
        study = cls(
            name=data.get("name", "study"),
            description=data.get("description", ""),
            base_preset=base.get("preset", "moe-grpo"),
            base_overrides=list(base.get("set", [])),
            seeds=list(seeds),
            variants=[Variant(v["name"], list(v.get("set", []))) for v in variants],
            parallel=int(data.get("parallel", 2)),
            reference=data.get("reference"),
            dose=data.get("dose"),
            seed_fields=_seed_fields(data.get("seed_fields", [])),
            bases=_bases(data.get("bases"), data.get("seed_fields")),
            analysis=_analysis(data.get("analysis")),
        )
        if study.reference is not None and study.reference not in names:
            raise FieldError([("reference", f"no variant named {study.reference!r}")])
        for variant in study.variants:  # fail before any run starts
            for seed in study.seeds[:1]:
                study.config_for(variant, seed)
        return study

    def base_of(self, seed: int) -> int:
        """The value the seed fields get for ``seed`` (the base it starts from)."""
        return seed % self.bases if self.bases else seed

    def config_for(self, variant: Variant, seed: int, extra: list[str] = ()) -> ExperimentConfig:
        data = apply_overrides(
            preset_dict(self.base_preset),
            [
                *self.base_overrides,
                *variant.overrides,
                *extra,
                f"run.seed={seed}",
                *(f"{path}={self.base_of(seed)}" for path in self.seed_fields),
            ],
        )
        try:
            return validate_config(data)
        except FieldError as exc:
            raise FieldError(
                [(f"variants.{variant.name}.{path}", msg) for path, msg in exc.errors]
            ) from None


ANALYSES = ("causal",)


def _analysis(value: Any) -> str | None:
    if value is not None and value not in ANALYSES:
        raise FieldError([("analysis", f"one of {', '.join(ANALYSES)}, or leave it out")])
    return value


def _bases(value: Any, seed_fields: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise FieldError([("bases", "give a positive number of bases")])
    if not seed_fields:
        raise FieldError([("bases", 'needs seed_fields, e.g. ["warm_start.seed"]')])
    return value


def _seed_fields(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise FieldError([("seed_fields", 'give a list of config paths, e.g. ["warm_start.seed"]')])
    if "run.seed" in value:
        raise FieldError([("seed_fields", "run.seed is always the seed; list other fields")])
    return list(value)


def load_definition(ref: str) -> StudyDefinition:
    """A path to STUDY.json, or a built-in name (``BUILTIN_STUDIES``)."""
    if ref in BUILTIN_STUDIES:
        text = resources.files("trainer.studies").joinpath(f"{ref}.json").read_text()
    else:
        path = Path(ref)
        if not path.exists():
            raise FieldError([("definition", f"no such file or built-in study: {ref}")])
        text = path.read_text()
    try:
        return StudyDefinition.from_dict(json.loads(text))
    except json.JSONDecodeError as exc:
        raise FieldError([("definition", f"not valid JSON: {exc}")]) from None


# ------------------------------------------------------------------------- running
def _run_one(args: tuple[dict, str]) -> str:
    from trainer.runner import train

    cfg_dict, run_dir = args
    train(validate_config(cfg_dict), Path(run_dir), log=lambda *_: None)
    return run_dir


def run_study(study: StudyDefinition, out: Path, extra: list[str] = ()) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    jobs = []
    # Seed-major: every cell gets its first seed before any gets its second, so a study
    # stopped early (it resumes) still covers every variant evenly.
    for seed in study.seeds:
        for variant in study.variants:
            run_dir = out / variant.name / f"seed{seed}"
            if not run_succeeded(run_dir):
                cfg = study.config_for(variant, seed, [*extra, "run.threads=1"])
                jobs.append((cfg.to_dict(), str(run_dir)))
    t0 = time.perf_counter()
    total = len(study.variants) * len(study.seeds)
    print(f"study {study.name}: {total} runs, {len(jobs)} to do, {study.parallel} at a time")
    if jobs:
        # Warm starts are cached per (model, task, warm_start): train each base once, up front,
        # so parallel runs do not race to train the same one.
        bases = {}
        for cfg_dict, _ in jobs:
            cfg = validate_config(cfg_dict)
            bases.setdefault(cfg.hash("model", "task", "warm_start"), cfg)
        _train_bases(list(bases.values()), study.parallel)
        ctx = mp.get_context("spawn")
        with ctx.Pool(max(1, study.parallel)) as pool:
            for i, run_dir in enumerate(pool.imap_unordered(_run_one, jobs), 1):
                print(f"  [{i}/{len(jobs)}] {run_dir}  ({time.perf_counter() - t0:.0f}s)")
    results = collect_results(study, out)
    write_report(study, results, out)
    if study.analysis == "causal":
        from trainer.analysis.causal_report import causal_report

        causal_report(study, out)
        print((out / "causal.md").read_text())
    return results


def _train_bases(configs: list[ExperimentConfig], parallel: int) -> None:
    """Each distinct base once, ``parallel`` at a time, on the runs' thread count:
    a CPU base's bits depend on it (trainer.warmstart.warm_start_key), so the
    runs find exactly the base trained here, the one a platform sweep of the
    same study trains too."""
    if len(configs) == 1 or parallel <= 1:
        for cfg in configs:
            _train_base(cfg.to_dict())
        return
    with mp.get_context("spawn").Pool(min(parallel, len(configs))) as pool:
        pool.map(_train_base, [cfg.to_dict() for cfg in configs])


def _train_base(cfg_dict: dict) -> None:
    import torch

    from trainer.tasks import make_task
    from trainer.warmstart import train_base_policy

    cfg = validate_config(cfg_dict)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    task = make_task(cfg.task)
    vocab = cfg.model.vocab_size or task.tokenizer.vocab_size
    train_base_policy(cfg, task, vocab, device=_device(cfg), log=lambda *_: None)


def _device(cfg: ExperimentConfig):
    from trainer.runner import resolve_device

    return resolve_device(cfg.run.device)


# ------------------------------------------------------------------------- results
def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(values) if values else None


def collect_results(study: StudyDefinition, out: Path) -> dict[str, Any]:
    variants = {}
    for variant in study.variants:
        seeds = []
        for seed in study.seeds:
            run_dir = out / variant.name / f"seed{seed}"
            if not run_succeeded(run_dir):  # a run stopped part-way is not a seed (it resumes)
                continue
            summary = json.loads((run_dir / SUMMARY_FILE).read_text())
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
    times = [s["summary"]["collapse_step"] if s["summary"]["collapsed"] else s["summary"]["steps"]
             for s in seeds]  # fmt: skip
    return [int(t) for t in times], [bool(s["summary"]["collapsed"]) for s in seeds]


def study_statistics(study: StudyDefinition, results: dict[str, Any], out: Path) -> dict[str, Any]:
    """Survival per variant, log-rank vs the reference, CIs, lead-lag, dose-response."""
    from trainer.analysis.intervals import mean_ci
    from trainer.lead_lag import lead_lag_table
    from trainer.survival_stats import kaplan_meier, log_rank, median_survival

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
    table = markdown_table(results)
    if results.get("statistics"):
        table += "\n\n" + statistics_table(results) + "\n\n" + kl_table(results)
        table += "\n\n" + lead_lag_markdown(results)
    (out / "table.md").write_text(table + "\n")
    print()
    print(table)
    try:
        from trainer.study_figures import write_figures

        for path in write_figures(results, out):
            print(f"figure: {path}")
    except ImportError as exc:  # matplotlib missing: the table still stands
        print(f"figures skipped: {exc}")


def select(study: StudyDefinition, variants: str | None, seeds: str | None) -> StudyDefinition:
    """The study restricted to some variants and/or seeds (a slice keeps the same run folders)."""
    chosen = study.variants
    if variants:
        names = [n.strip() for n in variants.split(",") if n.strip()]
        known = {v.name for v in study.variants}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise FieldError([("--variants", f"no such variant: {', '.join(unknown)}")])
        chosen = [v for v in study.variants if v.name in names]
    seed_list = study.seeds
    if seeds:
        try:
            seed_list = [int(x) for x in seeds.split(",") if x.strip()]
        except ValueError:
            raise FieldError([("--seeds", "give comma-separated integers, e.g. 0,1,2")]) from None
        if not seed_list or min(seed_list) < 0:
            raise FieldError([("--seeds", "give non-negative integer seeds")])
    return replace(study, variants=chosen, seeds=seed_list)


def check_overrides(study: StudyDefinition, overrides: list[str]) -> None:
    """``--set`` applies after every variant's own settings, so a path a variant
    sets would silently make that variant something else (``--set
    model.n_experts=16`` turns the dense variant, ``model.n_experts=0``, into
    a MoE): refuse it, naming the variants, and say where it belongs."""
    paths = {item.split("=", 1)[0].strip() for item in overrides}
    for path in sorted(paths):
        owners = [v.name for v in study.variants
                  if any(o.split("=", 1)[0].strip() == path for o in v.overrides)]  # fmt: skip
        if owners:
            message = (
                f"the variants {', '.join(owners)} set {path} themselves; "
                "put it in the study's base (a copy of the definition) instead"
            )
            raise FieldError([(f"--set {path}", message)])


def run_study_cli(
    ref: str,
    out: Path,
    overrides: list[str],
    variants: str | None = None,
    seeds: str | None = None,
) -> int:
    study = select(load_definition(ref), variants, seeds)
    check_overrides(study, overrides)
    run_study(study, out, overrides)
    return 0
