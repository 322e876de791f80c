"""MLflow ingestion through the real client: the lab against a real ``mlflow server``
(docs/benchmarks-archive.md, "MLflow ingestion: the lab against an MLflow server"; the current figure in docs/benchmarks.md).

Both servers run as they are deployed on one machine: the lab under gunicorn
(``lab.jobs.launch.web_command``, SQLite), ``mlflow server`` with a SQLite backend
and proxied artifacts (tests/mlflow_server.py). One ``MlflowClient`` logs a
verl-like stream (``--keys`` scalars a step, each point with its own timestamp)
with ``log_batch`` of 1,000 points, the client's batch size, into one run on each
server, in paired, interleaved rounds (A B | B A ...): each round logs
``--batches`` batches of new steps to each. Reported per server: points per
wall-clock second and per CPU second of the server's process tree plus this
client process; and the median per-round ratio lab / MLflow with its
order-statistic interval (bench/common.py), in wall time (what a training job
waits) and in the server's CPU time (the client's work left out: the same on both
sides), with the machine's load.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m bench.bench_tracking_vs_mlflow [--rounds 9]

Needs the full ``mlflow`` package (the dev extra).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform"), str(ROOT / "tests")]

from bench.common import (  # noqa: E402
    Stopwatch,
    busy_share,
    cpu_jiffies,
    machine_load,
    median_interval,
    round_orders,
    tree_cpu_s,
)

T0_MS = 1_700_000_000_000


def _stream(keys: int):
    """Batches of 1,000 points of a verl-like run: names, step, own timestamp, value."""
    from mlflow.entities import Metric

    names = [
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "critic/score/mean",
        "rollout_corr/kl",
        "rollout_corr/k3_kl",
        "response_length/mean",
        "timing_s/step",
    ]
    names += [f"bench/key_{i:03d}" for i in range(keys - len(names))]
    per_batch = max(1, 1000 // keys)
    step = 0
    while True:
        batch = [
            Metric(name, (s * 31 + i) % 97 / 97.0, T0_MS + 1000 * s + i, s)
            for s in range(step, step + per_batch)
            for i, name in enumerate(names)
        ]
        step += per_batch
        yield batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batches", type=int, default=5, help="log_batch calls per round")
    parser.add_argument("--keys", type=int, default=100, help="scalars per step")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.site.settings")
    from lab_processes import LabStack
    from mlflow import MlflowClient
    from mlflow_server import MlflowServer

    load_before, jiffies = machine_load(), cpu_jiffies()
    with tempfile.TemporaryDirectory() as tmp:
        lab = LabStack(Path(tmp) / "lab", "filesystem")
        reference = MlflowServer(Path(tmp) / "mlflow")
        try:
            os.environ["MLFLOW_TRACKING_TOKEN"] = lab.token  # the MLflow server ignores it
            servers = {
                "lab": (f"http://127.0.0.1:{lab.port}", lab.procs["web"].pid),
                "mlflow": (reference.uri, reference.proc.pid),
            }
            runs, streams, clients = {}, {}, {}
            for name, (uri, _) in servers.items():
                clients[name] = MlflowClient(uri)
                exp = clients[name].create_experiment(f"bench-{time.monotonic_ns()}")
                runs[name] = clients[name].create_run(exp).info.run_id
                streams[name] = _stream(args.keys)
                clients[name].log_batch(runs[name], metrics=next(streams[name]))  # warm-up
            wall = {n: [] for n in servers}
            cpu = {n: [] for n in servers}
            server_cpu = {n: [] for n in servers}
            points = 0
            for order in round_orders(list(servers), args.rounds):
                for name in order:
                    batches = [next(streams[name]) for _ in range(args.batches)]
                    points = sum(len(b) for b in batches)
                    server_before = tree_cpu_s(servers[name][1])
                    watch = Stopwatch("process", pids=[servers[name][1]])
                    for batch in batches:
                        clients[name].log_batch(runs[name], metrics=batch)
                    timing = watch.elapsed()
                    wall[name].append(timing.wall)
                    cpu[name].append(timing.cpu)
                    server_cpu[name].append(tree_cpu_s(servers[name][1]) - server_before)
        finally:
            reference.close()
            lab.close()

    def paired(samples: dict[str, list[float]]) -> dict[str, float]:
        ratios = [m / s for m, s in zip(samples["mlflow"], samples["lab"], strict=True)]
        low, high, coverage = median_interval(ratios)
        return {
            "median": round(statistics.median(ratios), 2),
            "low": round(low, 2),
            "high": round(high, 2),
            "coverage": round(coverage, 3),
        }

    results = {
        "points_per_round": points,
        "rounds": args.rounds,
        "keys_per_step": args.keys,
        "points_per_wall_second": {n: round(points / statistics.median(wall[n])) for n in servers},
        "points_per_cpu_second": {n: round(points / statistics.median(cpu[n])) for n in servers},
        "points_per_server_cpu_second": {
            n: round(points / statistics.median(server_cpu[n])) for n in servers
        },
        "lab_over_mlflow_wall": paired(wall),
        "lab_over_mlflow_server_cpu": paired(server_cpu),
        "wall_s": wall,
        "cpu_s": cpu,
        "server_cpu_s": server_cpu,
        "load_before": load_before,
        "load_after": machine_load(),
        "cpu_states": busy_share(jiffies, cpu_jiffies()),
    }
    print(json.dumps({k: v for k, v in results.items() if not k.endswith("_s")}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
