"""Server time of the queue and run lists with a long queue: GET /api/runs,
/api/queue and the queue page with 1,000 queued runs and 200 running (target:
p95 < 100 ms), on SQLite and PostgreSQL, with each request's query count.

"Server time" is the Django request cycle in process (middleware, session
auth, view, serializer, rendering), timed with the test client: no network,
no WSGI server. Requests go in paired rounds over the URLs (bench.common,
rotated order) so load from other processes hits each alike, timed in wall
and CPU time (this thread's plus, on PostgreSQL, the connection's server
backend's), with the load recorded.

    .venv/bin/python -m bench.bench_queue_api --db sqlite
    .venv/bin/python -m bench.bench_queue_api --db postgres [--pg postgres://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

URLS = ["/api/runs", "/api/runs?status=queued", "/api/queue", "/queue/"]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _pg_database(admin_url: str) -> tuple[str, object]:
    """A fresh PostgreSQL database (URL, dropper)."""
    import psycopg

    name = f"lab_bench_queue_{uuid.uuid4().hex[:8]}"
    admin = admin_url.replace("postgres://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return admin_url.rsplit("/", 1)[0] + "/" + name, drop


def fill(queued: int, running: int) -> None:
    """One experiment, one template run, then ``queued`` + ``running`` runs in bulk
    over two queues and three priorities."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from lab.experiments.services import create_experiment
    from lab.runs import lifecycle
    from lab.runs.models import Run, RunStatus

    user = get_user_model().objects.create_user("bench", password="pw", is_staff=True)
    experiment = create_experiment(owner=user, name="bench", preset="moe-grpo")
    template = lifecycle.submit_run(owner=user, experiment=experiment, preset="moe-grpo")
    now = timezone.now()
    runs = []
    for i in range(queued + running - 1):
        is_running = i < running
        runs.append(
            Run(
                experiment=experiment, owner=user, config=template.config, seed=i,
                total_steps=template.total_steps, queue=("cpu", "gpu-a100")[i % 2],
                priority=i % 3,
                status=RunStatus.RUNNING if is_running else RunStatus.QUEUED,
                started_at=now - timedelta(seconds=60) if is_running else None,
                current_step=5 if is_running else 0,
                worker_host="w1" if is_running else "",
            )
        )  # fmt: skip
    Run.objects.bulk_create(runs, batch_size=500)


def measure(requests: int) -> tuple[dict[str, dict[str, float]], dict[str, object]]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from bench.common import run_rounds

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    queries: dict[str, int] = {}
    for url in URLS:  # warm up, and count the queries of one request
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        queries[url] = len(captured)
    pids = []
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            pids.append(cur.fetchone()[0])
    timed = run_rounds(
        {url: functools.partial(client.get, url) for url in URLS}, requests, warmup=0, pids=pids
    )
    print(timed.load_line())
    results = {
        url: {
            "p50_ms": 1000 * statistics.median(timed.wall[url]),
            "p95_ms": 1000 * percentile(timed.wall[url], 0.95),
            "cpu_p50_ms": 1000 * statistics.median(timed.cpu[url]),
            "cpu_p95_ms": 1000 * percentile(timed.cpu[url], 0.95),
            "queries": queries[url],
        }
        for url in URLS
    }
    return results, timed.record()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--running", type=int, default=200)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lab-bench-queue-"))
    os.environ.update(
        {
            "LAB_VAR_DIR": str(tmp),
            "CELERY_BROKER_URL": "filesystem://",
            "DJANGO_SETTINGS_MODULE": "lab.site.settings",
            "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY", "bench"),
        }
    )
    drop = None
    if args.db == "postgres":
        os.environ["DATABASE_URL"], drop = _pg_database(args.pg)
    else:
        os.environ["DATABASE_URL"] = f"sqlite:///{tmp / 'db.sqlite3'}"
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    settings.ALLOWED_HOSTS = ["testserver"]
    try:
        call_command("migrate", verbosity=0)
        fill(args.queued, args.running)
        results, timing = measure(args.requests)
    finally:
        if drop is not None:
            drop()
    print(
        f"{args.db}: {args.queued} queued + {args.running} running, {args.requests} requests each"
    )
    print(f"{'url':28} {'p50 ms':>8} {'p95 ms':>8} {'CPU p50':>8} {'CPU p95':>8} {'queries':>8}")
    for url, row in results.items():
        print(f"{url:28} {row['p50_ms']:8.1f} {row['p95_ms']:8.1f} {row['cpu_p50_ms']:8.1f} "
              f"{row['cpu_p95_ms']:8.1f} {row['queries']:8d}")  # fmt: skip
    payload = {"db": args.db, "queued": args.queued, "running": args.running,
               "results": results, "timing": timing}  # fmt: skip
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"queue_api_{args.db}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
