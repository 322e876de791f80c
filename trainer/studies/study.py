"""Running a study: every (variant, seed) run into OUT/<variant>/seed<k>/, then its report.

A finished run is not run again, so an interrupted study continues where it
stopped. The distinct warm-start bases are trained first, then the runs, the
definition's ``parallel`` at a time. Definitions: ``trainer.studies.definition``; tables,
statistics and the report: ``trainer.studies.results``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainer.config import ExperimentConfig
from trainer.devices.mps import mps_daemon
from trainer.devices.packing import (
    apply_memory_share,
    claim_slot,
    parse_visible_devices,
    plan_slots,
)
from trainer.run_folder.files import run_succeeded
from trainer.studies.definition import StudyDefinition, check_overrides, load_definition, select
from trainer.studies.results import collect_results, write_report
from trainer.validation import validate_config


def _run_one(args: tuple[dict, str]) -> str:
    from trainer.run.runner import train

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
        first = next(iter(bases.values()))
        _train_bases(list(bases.values()), study.parallel)
        with _slot_pool(max(1, study.parallel), first) as pool:
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
    a CPU base's bits depend on it (trainer.run.warmstart.warm_start_key), so the
    runs find exactly the base trained here, the one a platform sweep of the
    same study trains too."""
    if len(configs) == 1 or parallel <= 1:
        for cfg in configs:
            _train_base(cfg.to_dict())
        return
    with _slot_pool(min(parallel, len(configs)), configs[0]) as pool:
        pool.map(_train_base, [cfg.to_dict() for cfg in configs])


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
            print(f"  {processes} processes on GPU(s) {','.join(devices)}; MPS: "
                  f"{'on' if state.active else 'off (' + state.reason + ')'}", flush=True)  # fmt: skip
        slots = ctx.Queue()
        for slot in plan_slots(processes, len(devices), devices or None):
            slots.put(slot)
        with ctx.Pool(processes, initializer=claim_slot, initargs=(slots,)) as pool:
            yield pool


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


def _train_base(cfg_dict: dict) -> None:
    import torch

    from trainer.run.warmstart import train_base_policy
    from trainer.tasks import make_task

    cfg = validate_config(cfg_dict)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    task = make_task(cfg.task)
    vocab = cfg.model.vocab_size or task.tokenizer.vocab_size
    device = _device(cfg)
    apply_memory_share(device)
    train_base_policy(cfg, task, vocab, device=device, log=lambda *_: None)


def _device(cfg: ExperimentConfig):
    from trainer.run.context import resolve_device

    return resolve_device(cfg.run.device)


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
