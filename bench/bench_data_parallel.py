"""Data-parallel scaling of a whole RL step: the same run on 1 and N gloo CPU
ranks, one thread each, started by torchrun as the worker starts it.

Strong scaling: the global batch (prompts per step x group size) is fixed by
the config, so N ranks each roll out and train on 1/N of it, and the ideal
step time is T1 / N.

Timing protocol (bench.common): the rank counts run in paired rounds (each
round launches every rank count once, rotated order), each launch ``--steps``
steps of which the first ``--skip`` are left out. Per launch:

* wall: the median step time of rank 0 (the run's ``time/step_s``);
* CPU: every rank runs the trainer under bench.step_clock, which records each
  step's process CPU time (gloo's threads included) and its phases; per step
  the ranks' sum ("work") and their maximum ("critical rank").

Efficiency in wall time is T1 / (N x TN), the median over rounds of the
per-round ratio. On a machine with fewer free cores than ranks that measures
contention, not scaling; the CPU figures do not depend on free cores:
``eff_cpu`` = C1 / (N x max-rank CN) is the efficiency N free cores would give
if no rank waited on another (an upper bound), ``work_x`` = sum CN / C1 the
extra CPU work the ranks do together (gradient exchange, per-rank fixed costs).

The warm start is bounded and kept out of the timing: one launch before the
rounds trains it with at most ``--warm-steps`` SFT steps (or reads it from the
warm-start cache, where an earlier bench run left it; ``--fresh-cache``: a
throwaway cache), and every timed launch reads it from the cache. A base of 50
SFT steps is barely trained (held-out accuracy near 0), so its responses run to
``rollout.max_new_tokens``: the step measured is the preset's longest, the
same for every rank count.

    .venv/bin/python -m bench.bench_data_parallel [--ranks 1 2] [--steps 12] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import (
    Rounds,
    Stopwatch,
    Timing,
    print_table,
    ratio_stats,
    round_orders,
    write_results,
)
from bench.step_clock import PHASES, read_rank_files
from trainer import metric_keys as K
from trainer.launch import launch_command
from trainer.run_folder.files import read_metrics

WALL_PHASES = {
    "rollout": K.TIME_ROLLOUT_S,
    "mismatch": K.TIME_MISMATCH_S,
    "update": K.TIME_TRAIN_S,
}


def _overrides(args, ranks: int, steps: int) -> list[str]:
    sets = [
        f"run.steps={steps}",
        "run.eval_every=1000",
        "run.checkpoint_every=1000",
        "run.threads=1",
        f"run.gpus={ranks}",
        f"parallel.strategy={json.dumps(args.strategy)}",
        f"rollout.prompts_per_step={args.prompts}",
        f"warm_start.max_steps={args.warm_steps}",
        f"warm_start.eval_every={max(1, min(50, args.warm_steps))}",
    ]
    return [item for s in sets for item in ("--set", s)]


def _launch(
    args, ranks: int, steps: int, out: Path, cache: Path | None
) -> tuple[Path, Timing, str]:
    """One torchrun launch under bench.step_clock; the run folder, the launch's
    wall and CPU time (all ranks and torchrun, start-up included) and its log."""
    run_dir = out / f"ranks{ranks}"
    trainer = ["-m", "bench.step_clock", str(run_dir / "cpu"), "run", "--preset", args.preset,
               "--out", str(run_dir)]  # fmt: skip
    cmd = launch_command(trainer, ranks_per_node=ranks)  # torchrun --standalone for several ranks
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if cache is not None:
        env["MOE_LAB_CACHE"] = str(cache)
    watch = Stopwatch()
    done = subprocess.run(
        [*cmd, *_overrides(args, ranks, steps)], env=env, capture_output=True, text=True
    )
    spent = watch.elapsed()
    if done.returncode != 0:
        raise SystemExit(f"{ranks} rank(s) failed:\n{done.stderr[-3000:]}")
    return run_dir, spent, done.stdout + done.stderr


def _summarise(run_dir: Path, skip: int) -> dict[str, float]:
    """Per-step medians of one launch: rank 0's wall phases, the ranks' CPU."""
    rows = read_metrics(run_dir)[skip:]
    per_rank = {r: steps[skip:] for r, steps in read_rank_files(run_dir / "cpu").items()}
    n_steps = min(len(s) for s in per_rank.values())
    out = {
        "step_wall_s": statistics.median(r[K.TIME_STEP_S] for r in rows),
        **{
            f"{name}_wall_s": statistics.median(r[key] for r in rows if r.get(key) is not None)
            for name, key in WALL_PHASES.items()
        },
        "step_cpu_sum_s": statistics.median(
            sum(s[i]["cpu_s"] for s in per_rank.values()) for i in range(n_steps)
        ),
        "step_cpu_max_s": statistics.median(
            max(s[i]["cpu_s"] for s in per_rank.values()) for i in range(n_steps)
        ),
    }
    rank0 = per_rank[0]
    for phase in PHASES:
        if all(f"{phase}_cpu_s" in s for s in rank0):
            out[f"{phase}_cpu_s"] = statistics.median(s[f"{phase}_cpu_s"] for s in rank0)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--preset", default="moe-grpo")
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out (warm-up)")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds of launches")
    parser.add_argument("--warm-steps", type=int, default=50, help="warm start's SFT step bound")
    parser.add_argument("--fresh-cache", action="store_true", help="a throwaway warm-start cache")
    args = parser.parse_args(argv)
    names = [f"{r} ranks" for r in args.ranks]
    launches: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        out, cache = Path(tmp), (Path(tmp) / "cache" if args.fresh_cache else None)
        # The bounded warm start (or its cached base), once, outside the timing.
        _, warm, log = _launch(args, 1, 1, out / "warm", cache)
        base_line = re.search(r"base policy: held-out accuracy [^\n]*", log)
        # Timing(wall=rank 0's step wall, cpu=step CPU summed over the ranks)
        wall = Rounds(names, scope="process CPU of every rank, summed")
        # Timing(wall=the launch's wall, cpu=step CPU of the busiest rank)
        critical = Rounds(names, scope="process CPU of the busiest rank")
        for i, order in enumerate(round_orders(names, args.rounds, "rotate")):
            wall.begin_round(order)
            critical.begin_round(order)
            for name in order:
                ranks = args.ranks[names.index(name)]
                run_dir, spent, _ = _launch(args, ranks, args.steps, out / f"round{i}", cache)
                s = _summarise(run_dir, args.skip)
                s |= {"launch_wall_s": spent.wall, "launch_cpu_s": spent.cpu}
                launches[name].append(s)
                wall.add(name, Timing(s["step_wall_s"], s["step_cpu_sum_s"]))
                critical.add(name, Timing(spent.wall, s["step_cpu_max_s"]))
        wall.finish()
        critical.finish()
    base, n1 = names[0], args.ranks[0]
    rows = []
    for name, ranks in zip(names, args.ranks, strict=True):
        med = {k: statistics.median(s[k] for s in launches[name]) for k in launches[name][0]}
        speed_wall = wall.ratio(base, name, "wall")  # T1 / TN per round
        eff_cpu = ratio_stats(  # C1 / (N x max-rank CN) per round
            [c * n1 for c in critical.samples(base, "cpu")],
            [c * ranks for c in critical.samples(name, "cpu")],
        )
        work = wall.ratio(name, base, "cpu")  # sum CN / C1 per round
        row = {
            "ranks": ranks,
            **{k: round(v, 3) for k, v in med.items() if not k.startswith("launch")},
            "speedup_wall": round(speed_wall.median, 2),
            "eff_wall": f"{speed_wall.median * n1 / ranks:.2f} "
            f"[{speed_wall.low * n1 / ranks:.2f}, {speed_wall.high * n1 / ranks:.2f}]",
            "eff_cpu": str(eff_cpu),
            "work_x": str(work),
            "launch_wall_s": round(med["launch_wall_s"], 1),
            "launch_cpu_s": round(med["launch_cpu_s"], 1),
        }
        rows.append(row)
    print(wall.load_line())
    base_text = base_line.group(0) if base_line else "base policy: not in the log"
    print(f"warm start (bounded at {args.warm_steps} SFT steps): {warm.wall:.1f} s wall, "
          f"{warm.cpu:.1f} s CPU, outside the timing; {base_text}")  # fmt: skip
    main_cols = ["ranks", "step_wall_s", "step_cpu_sum_s", "step_cpu_max_s", "speedup_wall",
                 "eff_wall", "eff_cpu", "work_x"]  # fmt: skip
    print_table(rows, main_cols)
    phase_cols = [f"{p}_{c}_s" for p in PHASES for c in ("wall", "cpu")]
    print_table(rows, ["ranks", *phase_cols, "launch_wall_s", "launch_cpu_s"])
    payload = {
        "args": vars(args),
        "argv": sys.argv[1:] if argv is None else argv,
        "rows": rows,
        "launches": launches,
        "warm_start": {
            "wall_s": warm.wall,
            "cpu_s": warm.cpu,
            "max_steps": args.warm_steps,
            "base": base_text,
        },
        "rounds_step": wall.record(baseline=base),
        "rounds_critical": critical.record(baseline=base),
    }
    write_results(f"data_parallel_{args.strategy}", payload)
    return payload


if __name__ == "__main__":
    main()
