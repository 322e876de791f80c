"""Platform tax: wall time of one tiny run through API + queue + worker + DB
versus the bare trainer CLI, same config, same machine. Target <= 1.05x.

Alternates bare and platform runs (bare, platform, bare, platform, ...) so
both see the same warm caches and machine load; reports the ratio of medians
and of minimums (the least disturbed samples on a shared machine).

    .venv/bin/python -m bench.bench_platform_tax [--repeat 3 --steps 20
        --broker redis://127.0.0.1:6379/7 --out bench/results/platform_tax.json]
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--preset", default="moe-grpo")
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lab-tax-"))
    queue = f"tax-{uuid.uuid4().hex[:8]}"
    os.environ.update(
        {
            "LAB_VAR_DIR": str(tmp),
            "CELERY_BROKER_URL": args.broker,
            "LAB_QUEUES": queue,
            "LAB_DEFAULT_QUEUE": queue,
            "DJANGO_SETTINGS_MODULE": "lab.site.settings",
        }
    )
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{tmp / 'db.sqlite3'}")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.test import APIClient

    from lab.configs import resolve_config
    from lab.jobs import launch
    from lab.runs.models import Run

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("tax")
    client = APIClient(SERVER_NAME="localhost")
    client.force_authenticate(user)
    exp_id = client.post("/api/experiments", {"name": "tax"}, format="json").json()["id"]
    config = resolve_config(preset=args.preset, overrides={"run.steps": args.steps}).to_dict()
    cfg_path = tmp / "config.json"
    cfg_path.write_text(json.dumps(config))

    log = open(tmp / "worker.log", "wb")  # noqa: SIM115
    worker = subprocess.Popen(
        launch.worker_command([queue], "tax@%h"), cwd=ROOT, env=launch.process_env(),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    bare, platform = [], []
    try:
        time.sleep(8)  # worker start-up is paid once per deployment, not per run
        for i in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "trainer", "run", "--config", str(cfg_path),
                 "--out", str(tmp / f"bare-{i}")],
                cwd=ROOT, check=True, capture_output=True,
            )  # fmt: skip
            bare.append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            body = client.post(
                "/api/runs", {"experiment": exp_id, "config": config}, format="json"
            ).json()
            while Run.objects.filter(pk=body["id"], status__in=["queued", "running"]).exists():
                time.sleep(0.05)
            platform.append(time.perf_counter() - t0)
            status = Run.objects.get(pk=body["id"]).status
            assert status == "succeeded", Run.objects.get(pk=body["id"]).error
    finally:
        worker.terminate()
        worker.wait(timeout=120)
    result = {
        "preset": args.preset,
        "steps": args.steps,
        "broker": args.broker.split("://")[0],
        "database": django.db.connection.vendor,
        "bare_cli_s": [round(x, 2) for x in bare],
        "platform_s": [round(x, 2) for x in platform],
        "ratio_of_medians": round(statistics.median(platform) / statistics.median(bare), 3),
        # On a shared machine the minimum is the least disturbed sample of each.
        "ratio_of_minimums": round(min(platform) / min(bare), 3),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
