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
        .venv/bin/python -m bench.bench_metric_storage [--steps 5000 --out bench/results/metric_storage.json]

The database named in DATABASE_URL is created (and dropped afterwards) by this script.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
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
        results = _run(args.steps)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(json.dumps(results, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))


def _run(steps: int) -> dict:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.site.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from lab.experiments.services import create_experiment
    from lab.jobs.tailer import MetricsTail
    from lab.runs import lifecycle
    from lab.runs.metrics.ingest import ingest_metrics
    from lab.runs.metrics.read import metric_series

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench")
    exp = create_experiment(owner=user, name="bench")
    run = lifecycle.submit_run(owner=user, experiment=exp, preset="moe-grpo")
    lines = _lines(steps)
    scalars = steps * N_SCALARS

    # A: the worker's path, from the file to the DB.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
        t0 = time.perf_counter()
        records = MetricsTail(path).read_all()
        batch = settings.LAB_METRICS_BATCH
        for i in range(0, len(records), batch):
            ingest_metrics(run.pk, records[i : i + batch])
        a_ingest = time.perf_counter() - t0
    # Re-ingesting everything (a resumed run) must not add rows.
    t0 = time.perf_counter()
    for i in range(0, len(lines), 500):
        ingest_metrics(run.pk, lines[i : i + 500])
    a_reingest = time.perf_counter() - t0
    keys = ["bench/key_00", "bench/key_30", "experts/load/L0"]
    t0 = time.perf_counter()
    for _ in range(5):
        data = metric_series(run.pk, keys, max_points=100_000)
    a_read = (time.perf_counter() - t0) / 5
    assert len(data["steps"]) == steps

    # B: per (run, key, chunk) rows.
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE bench_chunk (run_id bigint, key text, chunk int, vals jsonb,"
            " PRIMARY KEY (run_id, key, chunk))"
        )
        t0 = time.perf_counter()
        for i in range(0, len(lines), 500):
            rows: dict[tuple[str, int], dict] = {}
            for rec in lines[i : i + 500]:
                for k, v in rec.items():
                    if k != "step":
                        rows.setdefault((k, rec["step"] // CHUNK), {})[str(rec["step"])] = v
            cur.executemany(
                "INSERT INTO bench_chunk VALUES (%s, %s, %s, %s::jsonb) ON CONFLICT (run_id, key, chunk)"
                " DO UPDATE SET vals = bench_chunk.vals || excluded.vals",
                [(run.pk, k, c, json.dumps(v)) for (k, c), v in rows.items()],
            )
        b_ingest = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(5):
            cur.execute(
                "SELECT key, chunk, vals FROM bench_chunk WHERE run_id = %s AND key = ANY(%s)"
                " ORDER BY key, chunk",
                [run.pk, keys],
            )
            fetched = cur.fetchall()
        b_read = (time.perf_counter() - t0) / 5
        assert fetched

    # Live ingestion: a worker polling every LAB_POLL_S sees a few steps per read.
    live_steps, live_batch = min(steps, 1000), 2
    run2 = lifecycle.submit_run(owner=user, experiment=exp, preset="moe-grpo")
    t0 = time.perf_counter()
    for i in range(0, live_steps, live_batch):
        ingest_metrics(run2.pk, lines[i : i + live_batch])
    a_live = time.perf_counter() - t0
    with connection.cursor() as cur:
        t0 = time.perf_counter()
        for i in range(0, live_steps, live_batch):
            rows = {}
            for rec in lines[i : i + live_batch]:
                for k, v in rec.items():
                    if k != "step":
                        rows.setdefault((k, rec["step"] // CHUNK), {})[str(rec["step"])] = v
            cur.executemany(
                "INSERT INTO bench_chunk VALUES (%s, %s, %s, %s::jsonb) ON CONFLICT (run_id, key, chunk)"
                " DO UPDATE SET vals = bench_chunk.vals || excluded.vals",
                [(run2.pk, k, c, json.dumps(v)) for (k, c), v in rows.items()],
            )
        b_live = time.perf_counter() - t0
    live_points = live_steps * N_SCALARS

    return {
        "database": connection.vendor,
        "live_batches": f"{live_steps} steps in batches of {live_batch}",
        "A_live_scalar_points_per_s": round(live_points / a_live),
        "B_live_scalar_points_per_s": round(live_points / b_live),
        "steps": steps,
        "scalars_per_step": N_SCALARS,
        "vectors_per_step": f"{N_LAYERS} x {N_EXPERTS}",
        "A_row_per_step": {
            "ingest_s": round(a_ingest, 3),
            "scalar_points_per_s": round(scalars / a_ingest),
            "reingest_s": round(a_reingest, 3),
            "read_3_keys_all_steps_ms": round(a_read * 1000, 1),
        },
        "B_row_per_key_chunk": {
            "ingest_s": round(b_ingest, 3),
            "scalar_points_per_s": round(scalars / b_ingest),
            "read_3_keys_all_steps_ms": round(b_read * 1000, 1),
        },
    }


if __name__ == "__main__":
    main()
