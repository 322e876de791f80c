"""Device check row ``trl``: TRL's GRPOTrainer against the lab's RL step on the same
15.5M Qwen3-MoE checkpoint on the device (bench/bench_trl_step.py: the same work
per lab step and TRL generation cycle, paired rounds; on CUDA both train bf16,
device-synchronised wall time). Target on a GPU: the lab >= 1.3x. Skipped where
TRL or ``datasets`` is not installed (the GPU host gets them as carried wheels:
scripts/device-wheels). ``--dry``: the same code on a tiny checkpoint and batch,
on the CPU.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any


def trl(ctx) -> dict[str, Any]:
    missing = [m for m in ("trl", "datasets") if importlib.util.find_spec(m) is None]
    if missing:
        return {"status": "skipped", "reason": f"not installed: {', '.join(missing)}"}
    from bench import bench_trl_step as bench

    shape, batch = (bench.TINY_SHAPE, bench.TINY_BATCH) if ctx.dry else (bench.SHAPE, bench.BATCH)
    rounds, steps = (1, 2) if ctx.dry else (2, 3)
    with tempfile.TemporaryDirectory(prefix="device-check-trl-") as tmp:
        params = bench.write_checkpoint(Path(tmp), shape)
        result = bench.compare(Path(tmp), rounds, steps, ctx.device.type, batch)
    return {"status": "ran", "parameters": params, "batch": batch, "target": 1.3, **result}
