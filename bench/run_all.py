"""Run every benchmark in one go (``make bench``), each in its own process so
one benchmark's threads and caches never colour the next one's numbers.
Results land in bench/results/*.json; docs/benchmarks.md writes them up.
Every bench times wall AND CPU time in paired rounds and records the load
(bench/common.py); this runner prints each one's wall and CPU seconds and the
load average around it.

    .venv/bin/python -m bench.run_all [--only NAME ...] [--skip NAME ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from bench.common import Stopwatch

BENCHMARKS = (
    "bench_moe_layer",  # MoE layer vs dense-active and transformers' Mixtral block
    "bench_rollout",  # KV cache vs recompute vs transformers' generate()
    "bench_routing_flips",  # bf16 vs fp32 routing disagreement
    "bench_fp8_linear",  # emulated vs native (torch._scaled_mm) fp8 GEMMs on the CPU
    "bench_decode_compile",  # the decode step eager vs torch.compile on the CPU
    "bench_rl_step",  # one RL step broken down
    "bench_r3_overhead",  # R3 step-time overhead, routing storage vs bound
    "bench_downsample",  # dashboard chart data: time and payload
    "bench_metric_storage",  # metric storage designs
    "bench_queue_latency",  # submit -> trainer start on Redis
    "bench_platform_tax",  # API + queue + worker vs bare CLI
    "bench_active_params",  # RL step at fixed active parameters, 8-64 experts
    "bench_expert_cost",  # where 64 experts' extra step cost goes; AdamW loop vs fused
    "bench_expert_parallel",  # expert-parallel layer on 1, 2, 4 gloo ranks
    "bench_data_parallel",  # whole RL step on 1 and 2 data-parallel ranks
    "bench_hf_import",  # loading Hugging Face MoE checkpoints
    "bench_step_ops",  # operator calls per study step -> estimated GPU wall time
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--skip", nargs="*", default=[])
    args = parser.parse_args(argv)
    names = [b for b in BENCHMARKS if (args.only is None or b in args.only) and b not in args.skip]
    failed = []
    for name in names:
        print(f"\n===== {name} (load average {os.getloadavg()[0]:.2f})", flush=True)
        watch = Stopwatch()  # the child's CPU: RUSAGE_CHILDREN once it is reaped
        rc = subprocess.call([sys.executable, "-m", f"bench.{name}"])
        spent = watch.elapsed()
        print(f"===== {name}: exit {rc} in {spent.wall:.0f} s wall, {spent.cpu:.0f} s CPU "
              f"(load average {os.getloadavg()[0]:.2f})", flush=True)  # fmt: skip
        if rc:
            failed.append(name)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
