"""Data-parallel scaling of a whole RL step: the same run on 1 and N gloo CPU
ranks, one thread each, started by torchrun as the worker starts it.

Strong scaling: the global batch (prompts per step x group size) is fixed by
the config, so N ranks each roll out and train on 1/N of it, and the ideal
step time is T1 / N. Efficiency = T1 / (N * TN). The per-phase times (rollout,
mismatch measurement, update) come from the run's own metrics (rank 0), median
over the steps after the first ``--skip``; the warm start is trained once,
before any timed run, and read from the cache by every run.

    .venv/bin/python -m bench.bench_data_parallel [--ranks 1 2] [--steps 12]

On a machine with fewer free cores than ranks the ranks share cores and the
numbers measure contention, not scaling: the table records the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench.common import environment, print_table, write_results
from trainer import metric_keys as K
from trainer.launch import launch_command
from trainer.run.files import read_metrics

PHASES = {
    "step": K.TIME_STEP_S,
    "rollout": K.TIME_ROLLOUT_S,
    "mismatch": K.TIME_MISMATCH_S,
    "update": K.TIME_TRAIN_S,
}


def _overrides(args, ranks: int) -> list[str]:
    sets = [
        f"run.steps={args.steps}",
        "run.eval_every=1000",
        "run.checkpoint_every=1000",
        "run.threads=1",
        f"run.gpus={ranks}",
        f"parallel.strategy={json.dumps(args.strategy)}",
        f"rollout.prompts_per_step={args.prompts}",
    ]
    return [item for s in sets for item in ("--set", s)]


def _run(args, ranks: int, out: Path) -> Path:
    run_dir = out / f"ranks{ranks}"
    trainer = ["-m", "trainer", "run", "--preset", args.preset, "--out", str(run_dir)]
    cmd = launch_command(trainer, ranks=ranks)  # torchrun --standalone for several ranks
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*cmd, *_overrides(args, ranks)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{ranks} rank(s) failed:\n{done.stderr[-3000:]}")
    return run_dir


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--preset", default="moe-grpo")
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out (warm-up)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        # The warm start once, outside the timing (every run then reads the cache).
        warm = argparse.Namespace(**{**vars(args), "steps": 1})
        _run(warm, 1, out / "warm")
        medians = {}
        for ranks in args.ranks:
            rows = read_metrics(_run(args, ranks, out))[args.skip :]
            medians[ranks] = {
                name: statistics.median(r[key] for r in rows if r.get(key) is not None)
                for name, key in PHASES.items()
            }
    base = medians[args.ranks[0]]["step"] * args.ranks[0]
    rows = []
    for ranks, m in medians.items():
        row = {"ranks": ranks, **{f"{k}_s": round(v, 3) for k, v in m.items()}}
        row["speedup"] = round(base / args.ranks[0] / m["step"], 2)
        row["efficiency"] = round(base / (ranks * m["step"]), 2)
        rows.append(row)
    print_table(rows, list(rows[0]))
    load = (load_before, os.getloadavg()[0])
    print(f"load average before / after: {load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} cpus")
    payload = {"args": vars(args), "rows": rows, "load_average": load, "environment": environment()}
    write_results("data_parallel", payload)
    return payload


if __name__ == "__main__":
    main()
