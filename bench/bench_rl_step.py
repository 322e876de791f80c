"""One RL step of the tiny MoE preset, broken down into rollout, mismatch
metrics (the measurement forward) and update. Target: median step < 1 s on a
2-core CPU.

    .venv/bin/python -m bench.bench_rl_step [--steps 12] [--preset moe-grpo]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from trainer import metric_keys as K
from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.config.validation import validate_config
from trainer.run.files import read_metrics
from trainer.run.runner import train

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="moe-grpo")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = validate_config(
        apply_overrides(
            preset_dict(args.preset),
            [f"run.steps={args.steps}", f"run.eval_every={args.steps + 1}",
             f"run.threads={args.threads}", f"run.checkpoint_every={args.steps + 1}"],
        )
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp))
        rows = read_metrics(Path(tmp))[args.warmup :]
    parts = {
        "rollout_s": K.TIME_ROLLOUT_S,
        "mismatch_s": K.TIME_MISMATCH_S,
        "update_s": K.TIME_TRAIN_S,
        "step_s": K.TIME_STEP_S,
    }
    result = {
        "preset": args.preset,
        "threads": args.threads,
        "steps_measured": len(rows),
        **{name: statistics.median(r[key] for r in rows) for name, key in parts.items()},
        "rollout_tokens_per_s": statistics.median(r[K.THROUGHPUT_TOKENS_PER_S] for r in rows),
    }
    print(f"RL step, preset {args.preset}, {args.threads} threads, median of {len(rows)} steps")
    for name in parts:
        print(f"  {name:<12} {result[name] * 1000:8.1f} ms")
    print(f"  target: step < 1000 ms -> {'met' if result['step_s'] < 1.0 else 'NOT met'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "rl_step.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
