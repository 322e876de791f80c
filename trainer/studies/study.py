"""Running a study: every (variant, seed) run into OUT/<variant>/seed<k>/, then its report.

A finished run is not run again, and a stopped one resumes from its checkpoint,
so an interrupted study continues where it stopped. The distinct warm-start
bases are made ready first (from the cache, imported from ``--bases DIR``, or
trained; each exported to OUT/bases/: trainer.studies.bases), then the runs,
the definition's ``parallel`` at a time, packed on the GPUs with MPS where the
host has it (trainer.devices.packing, trainer.devices.mps). ``--budget-s S``
fits the study into S seconds: runs stop at a step boundary with a checkpoint
at the deadline, runs that would not get going are not started, and the plan
says beforehand how many fit (``--dry`` prints it only; trainer.studies.budget).
Each sitting appends what it did to OUT/sittings.jsonl. Definitions:
``trainer.studies.definition``; tables, statistics and the report:
``trainer.studies.results``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainer import metric_keys as K
from trainer.config import ExperimentConfig
from trainer.devices.mps import mps_daemon
from trainer.devices.packing import (
    apply_memory_share,
    claim_slot,
    parse_visible_devices,
    plan_slots,
)
from trainer.errors import FieldError
from trainer.run.warmstart import cache_dir
from trainer.run_folder.files import SUMMARY_FILE, read_metrics, run_succeeded
from trainer.studies import budget
from trainer.studies.bases import expected_key, held_bases
from trainer.studies.budget import MIN_STEPS_TO_START
from trainer.studies.definition import StudyDefinition, check_overrides, load_definition, select
from trainer.studies.results import collect_results, write_report
from trainer.validation import validate_config


def _run_one(args: tuple[dict, str, float | None]) -> dict[str, Any]:
    """One run (resumed from its checkpoint when it has one), ended by ``stop_at``
    (a ``time.time()`` deadline) at a step boundary; not started when too little
    of the budget is left for its start and ``MIN_STEPS_TO_START`` steps."""
    from trainer.run.runner import train

    cfg_dict, run_dir, stop_at = args
    cfg = validate_config(cfg_dict)
    record = {"run_dir": run_dir, "variant": Path(run_dir).parent.name}
    expected = _expected_run_s(Path(run_dir))
    if stop_at is not None and time.time() + expected > stop_at:
        return {**record, "status": "not started", "start_s": None, "step_s": None}
    began = time.perf_counter()
    summary = train(cfg, Path(run_dir), resume=True, log=lambda *_: None, stop_at=stop_at)
    rows = read_metrics(Path(run_dir))
    steps = [r[K.TIME_STEP_S] for r in rows if r.get(K.TIME_STEP_S)]
    loop = sum(steps[-summary.get("steps", 0) :]) if steps else 0.0
    return {
        **record,
        "status": summary["status"],
        "steps": summary.get("steps"),
        "seconds": round(time.perf_counter() - began, 2),
        "step_s": statistics.median(steps) if steps else None,
        # what this call spent outside its RL steps: process, model, base, evaluations
        "start_s": round(max(0.0, time.perf_counter() - began - loop), 2) if steps else None,
    }


def _expected_run_s(run_dir: Path) -> float:
    """A lower bound of what starting a run costs before it has done anything worth
    keeping: ``MIN_STEPS_TO_START`` steps at its own measured step time when it has
    one (a resumed run), else a few seconds."""
    steps = [r[K.TIME_STEP_S] for r in read_metrics(run_dir) if r.get(K.TIME_STEP_S)]
    return MIN_STEPS_TO_START * (statistics.median(steps) if steps else 1.0)


def run_study(
    study: StudyDefinition,
    out: Path,
    extra: list[str] = (),
    *,
    budget_s: float | None = None,
    bases_dir: Path | None = None,
    mps: str = "auto",
    dry: bool = False,
    device: str | None = None,
    whole: StudyDefinition | None = None,
) -> dict[str, Any]:
    """Run the study's unfinished runs into ``out`` (module docstring). ``budget_s``:
    stop cleanly within that many seconds (trainer.studies.budget); ``bases_dir``:
    import bases from there (trainer.studies.bases); ``mps``: auto | on | off
    (trainer.devices.mps); ``dry``: print the plan only; ``device``: the device
    kind the plan is for (default: this machine's). ``whole``: the definition
    ``study`` is a slice of (``--variants``, ``--seeds``): the folder's results,
    figures and analysis cover every finished run of it, not the slice's alone."""
    t_begin, started = time.perf_counter(), time.time()
    jobs, plan_jobs, bases = _jobs(study, out, extra)
    total = len(study.variants) * len(study.seeds)
    print(
        f"study {study.name}: {total} runs, {len(jobs)} to do, {study.parallel} at a time",
        flush=True,
    )
    first = next(iter(bases.values()), None)
    kind = device or budget.device_kind(first.run.device if first else "auto")
    device_type = "cpu" if kind == "cpu" else "cuda"
    held = held_bases(bases_dir)
    cached = {
        h
        for h, cfg in bases.items()
        if (cache_dir() / f"{expected_key(cfg, device_type)}.pt").exists()
    }
    to_train = set(bases) - held - cached
    if dry or budget_s is not None:
        plan = budget.plan(
            study.name,
            plan_jobs,
            kind,
            budget_s or 0.0,
            study.parallel,
            to_train,
            len((set(bases) - cached) & held),
            budget.folder_rows(study.name, out),
        )
        print(plan.text(), flush=True)
        if dry:
            return {"plan": plan.summary()}
    out.mkdir(parents=True, exist_ok=True)
    stop_at = None if budget_s is None else started + budget_s - budget.REPORT_RESERVE_S
    sitting: dict[str, Any] = {
        "started": round(started, 1),
        "device": kind,
        "budget_s": budget_s,
        "bases": [],
        "runs": [],
    }
    if jobs:
        sitting["bases"] = _train_bases(
            list(bases.values()), study.parallel, mps, bases_dir, out / "bases", stop_at
        )
        if all(b["status"] == "ready" for b in sitting["bases"]):
            with _slot_pool(max(1, study.parallel), first, mps) as (pool, state):
                sitting["mps"] = state.record()
                work = [(cfg, run_dir, stop_at) for cfg, run_dir in jobs]
                for i, record in enumerate(pool.imap_unordered(_run_one, work), 1):
                    sitting["runs"].append(record)
                    print(
                        f"  [{i}/{len(jobs)}] {record['run_dir']}: {record['status']}  "
                        f"({time.perf_counter() - t_begin:.0f}s)",
                        flush=True,
                    )
        _append_sitting(out, sitting)
    reported = whole or study
    results = collect_results(reported, out)
    write_report(reported, results, out)
    if reported.analysis in ("causal", "edge"):
        from trainer.analysis.causal_report import causal_report

        causal_report(reported, out)
        print((out / "causal.md").read_text())
    return results


def _jobs(study: StudyDefinition, out: Path, extra: list[str]):
    """The unfinished runs as (config dict, run folder) in the study's order, the same
    as plan jobs, and the distinct bases they start from (by config hash)."""
    jobs, plan_jobs, bases = [], [], {}
    # Seed-major: every cell gets its first seed before any gets its second, so a study
    # stopped early (it resumes) still covers every variant evenly.
    for seed in study.seeds:
        for variant in study.variants:
            run_dir = out / variant.name / f"seed{seed}"
            if run_succeeded(run_dir):
                continue
            cfg = study.config_for(variant, seed, [*extra, "run.threads=1"])
            base = cfg.hash("model", "task", "warm_start")
            bases.setdefault(base, cfg)
            jobs.append((cfg.to_dict(), str(run_dir)))
            left = cfg.run.steps - _steps_done(run_dir)
            plan_jobs.append(budget.Job(variant.name, seed, left, base))
    return jobs, plan_jobs, bases


def _steps_done(run_dir: Path) -> int:
    """Steps a stopped run keeps (its checkpoint's), 0 for one that never started."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return 0
    return int(summary.get("steps") or 0) if summary.get("status") == "stopped" else 0


def _append_sitting(out: Path, sitting: dict[str, Any]) -> None:
    with open(out / budget.SITTINGS_FILE, "a") as f:
        f.write(json.dumps(sitting) + "\n")


def _train_bases(
    configs: list[ExperimentConfig],
    parallel: int,
    mps: str,
    bases_dir: Path | None,
    export_dir: Path,
    stop_at: float | None,
) -> list[dict[str, Any]]:
    """Each distinct base once, ``parallel`` at a time, in the pool's processes (never
    in this one, which must not hold a CUDA context of its own), on the runs' thread
    count: a CPU base's bits depend on it (trainer.run.warmstart.warm_start_key), so
    the runs find exactly the base trained here, the one a platform sweep of the
    same study trains too. Imported from ``bases_dir`` where it holds them, exported
    to ``export_dir``. A base from another environment is refused (``FieldError``
    on ``--bases``)."""
    work = [
        (cfg.to_dict(), bases_dir and str(bases_dir), str(export_dir), stop_at) for cfg in configs
    ]
    with _slot_pool(min(max(1, parallel), len(configs)), configs[0], mps) as (pool, _):
        records = pool.map(_train_base, work)
    refused = [r["refused"] for r in records if r.get("refused")]
    if refused:
        raise FieldError([("--bases", message) for message in refused])
    for record in records:
        print(f"  base {record['key']}: {record['status']}; {record['how']}", flush=True)
    return records


@contextmanager
def _slot_pool(processes: int, cfg: ExperimentConfig, mps: str = "auto") -> Iterator[Any]:
    """A pool of ``processes`` spawned processes, each holding one slot for its life
    (trainer.devices.packing): on a GPU host, round-robin over the visible GPUs with
    each GPU's memory split among its processes, under an MPS daemon of the study's
    own where several share a GPU and the host has MPS (trainer.devices.mps,
    ``mps``: auto | on | off); on the CPU, plain processes."""
    ctx = mp.get_context("spawn")
    devices = _study_gpus(cfg)
    with mps_daemon(mps, devices, processes) as state:
        if devices:
            print(
                f"  {processes} processes on GPU(s) {','.join(devices)}; MPS: "
                f"{'on' if state.active else 'off (' + state.reason + ')'}",
                flush=True,
            )
        slots = ctx.Queue()
        for slot in plan_slots(processes, len(devices), devices or None):
            slots.put(slot)
        with ctx.Pool(processes, initializer=claim_slot, initargs=(slots,)) as pool:
            yield pool, state


def _study_gpus(cfg: ExperimentConfig) -> list[str]:
    """The GPUs the study's runs use: none for run.device=cpu; otherwise this process's
    visible devices (CUDA_VISIBLE_DEVICES, else 0..count-1)."""
    if cfg.run.device == "cpu":
        return []
    import torch

    count = torch.cuda.device_count()  # no CUDA context is created (NVML / driver count)
    if count == 0:
        return []
    visible = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    return visible[:count] if visible else [str(i) for i in range(count)]


def _train_base(args: tuple[dict, str | None, str, float | None]) -> dict[str, Any]:
    import torch

    from trainer.run.warmstart import train_base_policy, warm_start_key
    from trainer.studies.bases import BaseMismatch, export_base, import_base
    from trainer.tasks import make_task

    cfg_dict, bases_dir, export_dir, stop_at = args
    cfg = validate_config(cfg_dict)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    task = make_task(cfg.task)
    vocab = cfg.model.vocab_size or task.tokenizer.vocab_size
    device = _device(cfg)
    apply_memory_share(device)
    key = warm_start_key(cfg, vocab, device)
    how = "trained here"
    if bases_dir is not None:
        try:
            how = import_base(key, device, Path(bases_dir)) or f"not in {bases_dir}: trained here"
        except BaseMismatch as exc:
            return {"key": key, "status": "refused", "refused": str(exc), "how": ""}

    def interrupt() -> None:
        if stop_at is not None and time.time() >= stop_at:
            raise TimeoutError("the study's time budget ended during this warm start")

    began = time.perf_counter()
    try:
        base = train_base_policy(
            cfg, task, vocab, device=device, log=lambda *_: None, interrupt=interrupt
        )
    except TimeoutError:  # its state is kept: the next sitting continues it
        return {"key": key, "status": "stopped", "how": "the budget ended in its warm start"}
    if base.cached and how == "trained here":
        how = "from the warm-start cache"
    exported = export_base(cfg, key, device, Path(export_dir)) if cfg.warm_start.cache else None
    return {
        "key": key,
        "status": "ready",
        "how": how,
        "accuracy": base.accuracy,
        "seconds": round(time.perf_counter() - began, 2),
        "exported": exported and exported.name,
    }


def _device(cfg: ExperimentConfig):
    from trainer.run.context import resolve_device

    return resolve_device(cfg.run.device)


def run_study_cli(
    ref: str,
    out: Path,
    overrides: list[str],
    variants: str | None = None,
    seeds: str | None = None,
    **options: Any,
) -> int:
    """``trainer study``: ``options`` are ``run_study``'s keywords (budget_s,
    bases_dir, mps, dry, device), and ``rows`` (a rows file to merge the folder's
    measured rows into, instead of running)."""
    whole = load_definition(ref)
    study = select(whole, variants, seeds)
    check_overrides(study, overrides)
    rows_file = options.pop("rows", None)
    if rows_file is not None:
        rows = budget.folder_rows(study.name, out)
        held = budget.merge_rows(rows, Path(rows_file))
        print(f"{len(rows)} rows from {out} merged into {rows_file} ({held} rows)")
        return 0
    bases_dir = options.get("bases_dir")
    if bases_dir is not None and not Path(bases_dir).is_dir():
        raise FieldError([("--bases", f"no such folder: {bases_dir}")])
    budget_s = options.get("budget_s")
    if budget_s is not None and budget_s <= budget.REPORT_RESERVE_S:
        raise FieldError([("--budget-s", f"give more than {budget.REPORT_RESERVE_S:.0f} s")])
    run_study(study, out, overrides, whole=whole, **options)
    return 0
