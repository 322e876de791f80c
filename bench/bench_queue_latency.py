"""Queue latency on Redis: submit (Run row committed, wake-up published) to the
worker's claim, immediately before it spawns the trainer. Target < 1 s.

A real Celery worker (solo pool, prefetch 1) runs as a subprocess on a unique
queue; runs are submitted one at a time through runs.lifecycle.submit_run and
cancelled as soon as they start, so every sample meets an idle worker.
Latency is wall time by definition (waiting included); the load during the
samples is recorded with the result (bench.common.machine_load).

    .venv/bin/python -m bench.bench_queue_latency [--runs 10 --broker redis://127.0.0.1:6379/7
        --out bench/results/queue_latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from bench.common import machine_load  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    load_before = machine_load()
    tmp = Path(tempfile.mkdtemp(prefix="lab-bench-"))
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    os.environ.update(
        {
            "LAB_VAR_DIR": str(tmp),
            "CELERY_BROKER_URL": args.broker,
            "LAB_QUEUES": queue,
            "LAB_DEFAULT_QUEUE": queue,
            "LAB_HEARTBEAT_S": "0.5",
            "LAB_POLL_S": "0.1",
            "DJANGO_SETTINGS_MODULE": "lab.site.settings",
        }
    )
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{tmp / 'db.sqlite3'}")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from lab.experiments.services import create_experiment
    from lab.jobs import launch
    from lab.runs.lifecycle import cancel_run, submit_run
    from lab.runs.models import Run

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", is_staff=True)
    exp = create_experiment(owner=user, name="latency")
    log = open(tmp / "worker.log", "wb")  # noqa: SIM115
    worker = subprocess.Popen(
        launch.worker_command([queue], "bench@%h"), cwd=ROOT, env=launch.process_env(),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    samples = []
    try:
        time.sleep(8)  # worker start-up is not queue latency
        for _ in range(args.runs):
            run = submit_run(owner=user, experiment=exp, preset="moe-grpo")
            while not Run.objects.filter(pk=run.pk, started_at__isnull=False).exists():
                time.sleep(0.01)
            run.refresh_from_db()
            samples.append((run.started_at - run.created_at).total_seconds())
            cancel_run(run, user=user)
            while Run.objects.filter(pk=run.pk, status__in=["queued", "running"]).exists():
                time.sleep(0.05)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    result = {
        "load_before": load_before,
        "load_after": machine_load(),
        "broker": args.broker.split("://")[0],
        "database": django.db.connection.vendor,
        "runs": len(samples),
        "median_s": round(statistics.median(samples), 3),
        "max_s": round(max(samples), 3),
        "samples_s": [round(s, 3) for s in samples],
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
