"""Metric storage: ingestion and read speed of the two designs considered.

A (chosen, runs.models.MetricStep): one row per (run, step), all keys of the
  step in one JSON object; bulk INSERT ... ON CONFLICT (run, step) DO UPDATE.
B (rejected): one row per (run, key, chunk of 256 steps) holding {step: value};
  upsert merges maps (``values || excluded.values``), which is idempotent too.

Ingestion goes through the worker's own path for A: metrics.jsonl is read by
jobs.tailer.MetricsTail and written by runs.metrics.ingest.ingest_metrics in batches
of LAB_METRICS_BATCH. Target: >= 50,000 scalar points/s
into PostgreSQL.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/lab_bench \\
        .venv/bin/python -m bench.bench_metric_storage [--steps 5000 --rounds 3
        --out bench/results/metric_storage.json]

The database named in DATABASE_URL is created (and dropped afterwards) by this script.
Timed in paired rounds (bench.common: A and B ingestion, reads and live
ingestion once per round, rotated order; every ingestion into a fresh run),
wall and CPU time: this thread's plus, on PostgreSQL, the server backend's of
the connection (its /proc entry), with the load recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

N_SCALARS = 60
N_LAYERS = 4
N_EXPERTS = 8
CHUNK = 256


def _lines(steps: int) -> list[dict]:
    rng = random.Random(0)
    keys = [f"bench/key_{i:02d}" for i in range(N_SCALARS)]
    out = []
    for step in range(steps):
        row = {"step": step, **{k: rng.random() for k in keys}}
        for layer in range(N_LAYERS):
            load = [rng.random() for _ in range(N_EXPERTS)]
            total = sum(load)
            row[f"experts/load/L{layer}"] = [x / total for x in load]
        out.append(row)
    return out


def _admin_url(url: str) -> tuple[str, str]:
    base, name = url.rsplit("/", 1)
    return base.replace("postgres://", "postgresql://") + "/postgres", name


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lab_bench")
    os.environ["DATABASE_URL"] = url
    admin, name = _admin_url(url)
    import psycopg

    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        results = _run(args.steps, args.rounds)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(json.dumps(results, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))


def _chunk_rows(run_id: int, lines: list[dict]) -> list[tuple]:
    rows: dict[tuple[str, int], dict] = {}
    for rec in lines:
        for k, v in rec.items():
            if k != "step":
                rows.setdefault((k, rec["step"] // CHUNK), {})[str(rec["step"])] = v
    return [(run_id, k, c, json.dumps(v)) for (k, c), v in rows.items()]


B_UPSERT = (
    "INSERT INTO bench_chunk VALUES (%s, %s, %s, %s::jsonb) ON CONFLICT (run_id, key, chunk)"
    " DO UPDATE SET vals = bench_chunk.vals || excluded.vals"
)


def _run(steps: int, rounds: int) -> dict:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.site.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from bench.common import measure, run_rounds
    from lab.experiments.services import create_experiment
    from lab.jobs.tailer import MetricsTail
    from lab.runs import lifecycle
    from lab.runs.metrics.ingest import ingest_metrics
    from lab.runs.metrics.read import metric_series

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench")
    exp = create_experiment(owner=user, name="bench")
    lines = _lines(steps)
    scalars = steps * N_SCALARS
    live_steps, live_batch = min(steps, 1000), 2
    keys = ["bench/key_00", "bench/key_30", "experts/load/L0"]
    # The database's own CPU: the server backend of Django's connection (PostgreSQL).
    pids = []
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            pids.append(cur.fetchone()[0])
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE bench_chunk (run_id bigint, key text, chunk int, vals jsonb,"
            " PRIMARY KEY (run_id, key, chunk))"
        )
    tmp = tempfile.TemporaryDirectory()
    path = Path(tmp.name) / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))

    def new_run() -> int:
        return lifecycle.submit_run(owner=user, experiment=exp, preset="moe-grpo").pk

    def a_ingest() -> None:  # A: the worker's path, from the file to the DB
        run_id, records = new_run(), MetricsTail(path).read_all()
        batch = settings.LAB_METRICS_BATCH
        for i in range(0, len(records), batch):
            ingest_metrics(run_id, records[i : i + batch])

    def b_ingest() -> None:  # B: per (run, key, chunk) rows
        run_id = new_run()
        with connection.cursor() as cur:
            for i in range(0, len(lines), 500):
                cur.executemany(B_UPSERT, _chunk_rows(run_id, lines[i : i + 500]))

    # Live ingestion: a worker polling every LAB_POLL_S sees a few steps per read.
    def a_live() -> None:
        run_id = new_run()
        for i in range(0, live_steps, live_batch):
            ingest_metrics(run_id, lines[i : i + live_batch])

    def b_live() -> None:
        run_id = new_run()
        with connection.cursor() as cur:
            for i in range(0, live_steps, live_batch):
                cur.executemany(B_UPSERT, _chunk_rows(run_id, lines[i : i + live_batch]))

    # The reads read one run of each design, written before the rounds.
    read_run = new_run()
    for i in range(0, len(lines), 500):
        ingest_metrics(read_run, lines[i : i + 500])
    with connection.cursor() as cur:
        for i in range(0, len(lines), 500):
            cur.executemany(B_UPSERT, _chunk_rows(read_run, lines[i : i + 500]))

    def a_read() -> None:
        assert len(metric_series(read_run, keys, max_points=100_000)["steps"]) == steps

    def b_read() -> None:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT key, chunk, vals FROM bench_chunk WHERE run_id = %s AND key = ANY(%s)"
                " ORDER BY key, chunk",
                [read_run, keys],
            )
            assert cur.fetchall()

    fns = {"A ingest": a_ingest, "B ingest": b_ingest, "A read": a_read, "B read": b_read,
           "A live": a_live, "B live": b_live}  # fmt: skip
    timed = run_rounds(fns, rounds, warmup=0, pids=pids)
    # Re-ingesting everything (a resumed run) must not add rows: A only.
    reingest, _ = measure(
        lambda: [ingest_metrics(read_run, lines[i : i + 500]) for i in range(0, len(lines), 500)],
        pids=pids,
    )
    tmp.cleanup()
    med = timed.median
    live_points = live_steps * N_SCALARS
    print(timed.load_line())
    return {
        "database": connection.vendor,
        "cpu": "this thread + the database backend" if pids else "this thread (SQLite in process)",
        "rounds": rounds,
        "live_batches": f"{live_steps} steps in batches of {live_batch}",
        "steps": steps,
        "scalars_per_step": N_SCALARS,
        "vectors_per_step": f"{N_LAYERS} x {N_EXPERTS}",
        **{
            f"{design}_{what}": {
                "wall_s": round(med(f"{design} {what}", "wall"), 4),
                "cpu_s": round(med(f"{design} {what}", "cpu"), 4),
                "points_per_wall_s": round(n / med(f"{design} {what}", "wall")),
                "points_per_cpu_s": round(n / med(f"{design} {what}", "cpu")),
            }
            for design in ("A", "B")
            for what, n in (("ingest", scalars), ("live", live_points), ("read", len(keys) * steps))
        },
        "A_reingest": {"wall_s": round(reingest.wall, 3), "cpu_s": round(reingest.cpu, 3)},
        "B_over_A_ingest_cpu": timed.ratio("B ingest", "A ingest").as_dict(),
        "B_over_A_read_cpu": timed.ratio("B read", "A read").as_dict(),
        "timing": timed.record(),
    }


if __name__ == "__main__":
    main()
