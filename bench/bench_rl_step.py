"""One RL step of the tiny MoE preset, broken down into rollout, mismatch
metrics (the measurement forward) and update. Target: median step < 1 s on a
2-core CPU.

Wall times are the trainer's own ``time/*`` metrics; the CPU time of each step
and phase comes from bench.step_clock (thread CPU with one torch thread,
process CPU with more), the figure to trust on a loaded machine. The load is
recorded with the result.

    .venv/bin/python -m bench.bench_rl_step [--steps 12] [--preset moe-grpo] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.common import machine_load, set_threads, write_results
from bench.step_clock import PHASES, StepClock
from trainer import metric_keys as K
from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.run.runner import train
from trainer.run_folder.files import read_metrics
from trainer.validation import validate_config


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="moe-grpo")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    load_before = machine_load()
    cfg = validate_config(
        apply_overrides(
            preset_dict(args.preset),
            [f"run.steps={args.steps}", f"run.eval_every={args.steps + 1}",
             f"run.threads={args.threads}", f"run.checkpoint_every={args.steps + 1}"],
        )
    )  # fmt: skip
    scope = "thread" if args.threads == 1 else "process"
    with tempfile.TemporaryDirectory() as tmp, StepClock(scope) as clock:
        train(cfg, Path(tmp))
        rows = read_metrics(Path(tmp))[args.warmup :]
    cpu_rows = clock.steps[args.warmup :]
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
        "cpu_scope": scope,
        "step_cpu_s": statistics.median(r["cpu_s"] for r in cpu_rows),
        **{
            f"{phase}_cpu_s": statistics.median(r[f"{phase}_cpu_s"] for r in cpu_rows)
            for phase in PHASES
            if all(f"{phase}_cpu_s" in r for r in cpu_rows)
        },
        "load_before": load_before,
        "load_after": machine_load(),
    }
    print(f"RL step, preset {args.preset}, {args.threads} threads, median of {len(rows)} steps")
    print(
        f"load average {load_before['loadavg_1m']} -> {result['load_after']['loadavg_1m']} "
        f"on {load_before['usable_cpus']} usable CPUs"
    )
    cpu_names = {"rollout_s": "rollout", "mismatch_s": "mismatch", "update_s": "update"}
    print(f"  {'':<12} {'wall ms':>9} {'cpu ms':>9}")
    for name in parts:
        key = f"{cpu_names.get(name, 'step')}_cpu_s"
        cpu = f"{result[key] * 1000:9.1f}" if key in result else f"{'-':>9}"
        print(f"  {name:<12} {result[name] * 1000:9.1f} {cpu}")
    met = result["step_cpu_s"] < 1.0
    print(f"  target: step < 1000 ms (CPU time) -> {'met' if met else 'NOT met'}")
    write_results("rl_step", {"args": vars(args), **result})
    return result


if __name__ == "__main__":
    main()
