"""Device check row ``packed``: aggregate RL steps per second with 1, 4, 8 and 16
runs packed on one GPU, without and with CUDA MPS.

Each mode (MPS off, MPS on) starts the largest number of worker processes once,
each in its own slot (trainer.devices.packing: ``CUDA_VISIBLE_DEVICES`` and an
equal share of the GPU's memory), MPS clients of a daemon of the row's own in
the second mode (trainer.devices.mps). A worker warms up (its CUDA context, the
kernels) with one short run, then waits. For each count n, n workers start a
run of ``steps`` RL steps of the preset at the same instant (a start time on
the system-wide monotonic clock) and report their ``time/step_s``; the row
gives

* ``steps_per_s``: the sum over the n runs of 1 / (median step time after the
  first step): the steady aggregate rate while all n train at once;
* ``wall_steps_per_s``: n x steps / (last finish - common start), setup and the
  first step included: what a study of such runs gets;
* ``speedup``: steps_per_s over the single run's.

``--dry`` (the CPU): 1 and 2 processes, 2 steps, MPS skipped (no GPU).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainer.devices.mps import mps_daemon
from trainer.devices.packing import claim_slot, parse_visible_devices, plan_slots

COUNTS = (1, 4, 8, 16)
STEPS = 12


def _config(preset: str, steps: int, device: str, dry: bool):
    from trainer.config import apply_overrides
    from trainer.config.presets import preset_dict
    from trainer.validation import validate_config

    overrides = [
        f"run.steps={steps}", f"run.eval_every={steps + 1}", f"run.checkpoint_every={steps + 1}",
        "warm_start.enabled=false", f"run.device={device}", "run.threads=1",
    ]  # fmt: skip
    if dry:
        overrides += ["rollout.prompts_per_step=4", "rollout.group_size=2"]
    return validate_config(apply_overrides(preset_dict(preset), overrides))


def _run(preset: str, steps: int, device: str, dry: bool) -> list[float]:
    from trainer import metric_keys as K
    from trainer.run.runner import train
    from trainer.run_folder.files import read_metrics

    with tempfile.TemporaryDirectory(prefix="packed-") as tmp:
        train(_config(preset, steps, device, dry), Path(tmp), log=lambda *_: None)
        return [row[K.TIME_STEP_S] for row in read_metrics(Path(tmp))]


def _worker(slots, commands, results, preset: str, device: str, dry: bool) -> None:
    """One packed process: take a slot, warm up, then run what ``commands`` asks
    (``(start_at, steps)``; None ends it) and put ``(start, end, step times)``."""
    claim_slot(slots)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (the runs' progress lines)
    try:
        _run(preset, 2, device, dry)  # CUDA context, kernels, allocator
        results.put(("ready", None))
        while (command := commands.get()) is not None:
            start_at, steps = command
            time.sleep(max(0.0, start_at - time.monotonic()))
            began = time.monotonic()
            steps_s = _run(preset, steps, device, dry)
            results.put(("ran", (began, time.monotonic(), steps_s)))
    except Exception as exc:  # reported, so the row says why instead of hanging
        results.put(("failed", f"{type(exc).__name__}: {exc}"[:400]))


def _measure_mode(mps: str, counts: tuple[int, ...], steps: int, preset: str, ctx) -> dict:
    spawn = mp.get_context("spawn")
    device = ctx.device.type
    # the first GPU this process may use (a host may have handed it one by its number)
    visible = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES", "")) or ["0"]
    gpus = visible[:1] if device == "cuda" else []
    most = max(counts)
    with mps_daemon(mps, gpus, most) as state:
        if mps != "off" and not state.active:
            return {"status": "skipped", "reason": state.reason}
        slots = spawn.Queue()
        for slot in plan_slots(most, len(gpus), gpus or None):
            slots.put(slot)
        results = spawn.Queue()
        commands = [spawn.Queue() for _ in range(most)]
        workers = [
            spawn.Process(target=_worker, args=(slots, q, results, preset, device, ctx.dry))
            for q in commands
        ]
        for w in workers:
            w.start()
        try:
            rows = _rounds(counts, steps, commands, results, ctx)
        finally:
            for q in commands:
                q.put(None)
            for w in workers:
                w.join(timeout=30)
                if w.is_alive():
                    w.kill()
    return {"status": "ran", "mps": state.record(), "rows": rows}


def _rounds(counts, steps, commands, results, ctx) -> list[dict[str, Any]]:
    for _ in commands:  # every worker warmed up
        kind, detail = results.get(timeout=max(ctx.left(), 60))
        if kind == "failed":
            raise RuntimeError(f"a packed worker failed to start: {detail}")
    rows = []
    for n in counts:
        if ctx.left() < 20:
            rows.append({"runs": n, "status": "skipped", "reason": "time budget spent"})
            continue
        start_at = time.monotonic() + 1.0
        for q in commands[:n]:
            q.put((start_at, steps))
        done = [results.get(timeout=max(ctx.left(), 60)) for _ in range(n)]
        failed = [detail for kind, detail in done if kind == "failed"]
        if failed:
            rows.append({"runs": n, "status": "failed", "reason": failed[0]})
            continue
        per_run = [statistics.median(s[1:] or s) for _, (_, _, s) in done]
        last_end = max(end for _, (_, end, _) in done)
        rows.append(
            {
                "runs": n,
                "status": "ran",
                "steps_per_s": sum(1.0 / t for t in per_run),
                "wall_steps_per_s": n * steps / (last_end - start_at),
                "median_step_s": statistics.median(per_run),
            }
        )
    single = next((r["steps_per_s"] for r in rows if r.get("runs") == 1 and "steps_per_s" in r),
                  None)  # fmt: skip
    for row in rows:
        if single and "steps_per_s" in row:
            row["speedup"] = row["steps_per_s"] / single
    return rows


def packed(ctx, preset: str = "moe-grpo") -> dict[str, Any]:
    counts, steps = ((1, 2), 2) if ctx.dry else (COUNTS, STEPS)
    modes = {"without_mps": "off", "with_mps": "auto"}
    out: dict[str, Any] = {"status": "ran", "preset": preset, "steps": steps}
    for name, mode in modes.items():
        if ctx.left() < 60:
            out[name] = {"status": "skipped", "reason": "time budget spent"}
            continue
        try:
            out[name] = _measure_mode(mode, counts, steps, preset, ctx)
        except Exception as exc:
            out[name] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:400]}
    return out
