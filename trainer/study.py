"""The stability study: variants x seeds, one table, the figures behind it.

A study definition is JSON (the platform runs the same definition as a sweep):

    {
      "name": "quick",
      "description": "...",
      "base": {"preset": "moe-grpo", "set": ["run.steps=60", ...]},
      "seeds": [0, 1, 2],
      "variants": [
        {"name": "dense-grpo", "set": ["model.n_experts=0"]},
        {"name": "moe-grpo-r3", "set": ["stabilizers.routing_replay=\\"r3\\""]}
      ]
    }

Each run's config = base preset + base ``set`` + the variant's ``set`` +
``run.seed``. Runs land in OUT/<variant>/seed<k>/; a finished run is not run
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
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from trainer import metric_keys as K
from trainer.collapse import CollapseSummary, summarize_collapses
from trainer.config import ConfigError, ExperimentConfig, apply_overrides, validate_config
from trainer.presets import preset_dict
from trainer.run_files import SUMMARY_FILE, read_metrics

BUILTIN_STUDIES = ("quick", "full")


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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudyDefinition:
        def need(obj: dict, key: str, where: str):
            if key not in obj:
                raise ConfigError([(f"{where}{key}", "required")])
            return obj[key]

        base = need(data, "base", "")
        variants = need(data, "variants", "")
        if not isinstance(variants, list) or not variants:
            raise ConfigError([("variants", "give at least one variant")])
        names = [need(v, "name", f"variants.{i}.") for i, v in enumerate(variants)]
        if len(set(names)) != len(names):
            raise ConfigError([("variants", "variant names must be unique")])
        seeds = data.get("seeds", [0, 1, 2])
        if not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
            raise ConfigError([("seeds", "give a list of non-negative integer seeds")])
        study = cls(
            name=data.get("name", "study"),
            description=data.get("description", ""),
            base_preset=base.get("preset", "moe-grpo"),
            base_overrides=list(base.get("set", [])),
            seeds=list(seeds),
            variants=[Variant(v["name"], list(v.get("set", []))) for v in variants],
            parallel=int(data.get("parallel", 2)),
        )
        for variant in study.variants:  # fail before any run starts
            for seed in study.seeds[:1]:
                study.config_for(variant, seed)
        return study

    def config_for(self, variant: Variant, seed: int, extra: list[str] = ()) -> ExperimentConfig:
        data = apply_overrides(
            preset_dict(self.base_preset),
            [*self.base_overrides, *variant.overrides, *extra, f"run.seed={seed}"],
        )
        try:
            return validate_config(data)
        except ConfigError as exc:
            raise ConfigError(
                [(f"variants.{variant.name}.{path}", msg) for path, msg in exc.errors]
            ) from None


def load_definition(ref: str) -> StudyDefinition:
    """A path to STUDY.json, or a built-in name (quick, full)."""
    if ref in BUILTIN_STUDIES:
        text = resources.files("trainer.studies").joinpath(f"{ref}.json").read_text()
    else:
        path = Path(ref)
        if not path.exists():
            raise ConfigError([("definition", f"no such file or built-in study: {ref}")])
        text = path.read_text()
    try:
        return StudyDefinition.from_dict(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ConfigError([("definition", f"not valid JSON: {exc}")]) from None


# ------------------------------------------------------------------------- running
def _run_one(args: tuple[dict, str]) -> str:
    from trainer.runner import train

    cfg_dict, run_dir = args
    train(validate_config(cfg_dict), Path(run_dir), log=lambda *_: None)
    return run_dir


def _finished(run_dir: Path) -> bool:
    path = run_dir / SUMMARY_FILE
    return path.exists() and json.loads(path.read_text()).get("status") == "succeeded"


def run_study(study: StudyDefinition, out: Path, extra: list[str] = ()) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    jobs = []
    for variant in study.variants:
        for seed in study.seeds:
            run_dir = out / variant.name / f"seed{seed}"
            if not _finished(run_dir):
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
        _train_bases(list(bases.values()))
        ctx = mp.get_context("spawn")
        with ctx.Pool(max(1, study.parallel)) as pool:
            for i, run_dir in enumerate(pool.imap_unordered(_run_one, jobs), 1):
                print(f"  [{i}/{len(jobs)}] {run_dir}  ({time.perf_counter() - t0:.0f}s)")
    results = collect_results(study, out)
    write_report(study, results, out)
    return results


def _train_bases(configs: list[ExperimentConfig]) -> None:
    from trainer.tasks import make_task
    from trainer.warmstart import train_base_policy

    for cfg in configs:
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
            if not (run_dir / SUMMARY_FILE).exists():
                continue
            summary = json.loads((run_dir / SUMMARY_FILE).read_text())
            rows = read_metrics(run_dir)
            seeds.append(
                {
                    "seed": seed,
                    "summary": summary,
                    "kl_k3": _mean([r.get(K.MISMATCH_KL_K3) for r in rows]),
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
                        )
                    },
                }
            )
        variants[variant.name] = {"seeds": seeds, "row": table_row(seeds)}
    return {"study": study.name, "seeds": study.seeds, "variants": variants}


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


def write_report(study: StudyDefinition, results: dict[str, Any], out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=1))
    table = markdown_table(results)
    (out / "table.md").write_text(table + "\n")
    print()
    print(table)
    try:
        from trainer.study_figures import write_figures

        for path in write_figures(results, out):
            print(f"figure: {path}")
    except ImportError as exc:  # matplotlib missing: the table still stands
        print(f"figures skipped: {exc}")


def run_study_cli(ref: str, out: Path, overrides: list[str]) -> int:
    study = load_definition(ref)
    run_study(study, out, overrides)
    return 0
