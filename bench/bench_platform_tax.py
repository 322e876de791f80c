"""Platform tax: wall time of one tiny run through API + queue + worker + DB
versus the bare trainer CLI, same config, same machine. Target <= 1.05x.

After one untimed run of each (the warm start, then cached, and the worker's
first task), paired rounds (bench.common: bare, platform | platform, bare | ...) so both
see the same warm caches and machine load, in wall and CPU time: the bare CLI
is a child process (its CPU from RUSAGE_CHILDREN), the platform path is this
process (API client, polling) plus the worker's whole process tree (its /proc
entries: the worker, its pool and the trainer it starts). Reports the median
of the per-round ratios with their 95% interval, in both clocks (trust the CPU
one on a loaded machine), the ratio of medians and of minimums, and the load.

    .venv/bin/python -m bench.bench_platform_tax [--repeat 3 --steps 20
        --broker redis://127.0.0.1:6379/7 --out bench/results/platform_tax.json]
"""

from __future__ import annotations

import argparse
import functools
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

from bench.common import Rounds, measure, round_orders  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--preset", default="moe-grpo")
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--threads", type=int, default=1, help="the runs' run.threads")
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
    # One torch thread: on a shared machine OpenMP threads spin on busy cores,
    # which inflates both clocks (bench/common.py).
    overrides = {"run.steps": args.steps, "run.threads": args.threads}
    config = resolve_config(preset=args.preset, overrides=overrides).to_dict()
    cfg_path = tmp / "config.json"
    cfg_path.write_text(json.dumps(config))

    log = open(tmp / "worker.log", "wb")  # noqa: SIM115
    worker = subprocess.Popen(
        launch.worker_command([queue], "tax@%h"), cwd=ROOT, env=launch.process_env(),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip

    def bare(i: int) -> None:
        subprocess.run(
            [sys.executable, "-m", "trainer", "run", "--config", str(cfg_path),
             "--out", str(tmp / f"bare-{i}")],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip

    def through_platform(_i: int) -> None:
        body = client.post("/api/runs", {"experiment": exp_id, "config": config}, format="json")
        run_id = body.json()["id"]
        while Run.objects.filter(pk=run_id, status__in=["queued", "running"]).exists():
            time.sleep(0.05)
        status = Run.objects.get(pk=run_id).status
        assert status == "succeeded", Run.objects.get(pk=run_id).error

    variants = {"bare": bare, "platform": through_platform}
    timed = Rounds(list(variants), scope="thread + children (bare) / + the worker's tree")
    try:
        time.sleep(8)  # worker start-up is paid once per deployment, not per run
        # One untimed run each: the first pays the warm start (then cached) and
        # the worker's first-task set-up, neither of which is the tax.
        bare(-1)
        through_platform(-1)
        for i, order in enumerate(round_orders(list(variants), args.repeat, "rotate")):
            timed.begin_round(order)
            for name in order:
                call = functools.partial(variants[name], i)
                timed.add(name, measure(call, pids=[worker.pid])[0])
    finally:
        worker.terminate()
        worker.wait(timeout=120)
    timed.finish()
    wall_b, wall_p = timed.wall["bare"], timed.wall["platform"]
    result = {
        "preset": args.preset,
        "steps": args.steps,
        "broker": args.broker.split("://")[0],
        "database": django.db.connection.vendor,
        "bare_cli_s": [round(x, 2) for x in wall_b],
        "platform_s": [round(x, 2) for x in wall_p],
        "bare_cli_cpu_s": [round(x, 2) for x in timed.cpu["bare"]],
        "platform_cpu_s": [round(x, 2) for x in timed.cpu["platform"]],
        "paired_ratio_wall": timed.ratio("platform", "bare", "wall").as_dict(),
        "paired_ratio_cpu": timed.ratio("platform", "bare", "cpu").as_dict(),
        "ratio_of_medians": round(statistics.median(wall_p) / statistics.median(wall_b), 3),
        # On a shared machine the minimum is the least disturbed sample of each.
        "ratio_of_minimums": round(min(wall_p) / min(wall_b), 3),
        "load_before": timed.load_before,
        "load_after": timed.load_after,
        "cpu_states": timed.cpu_states,
    }
    print(timed.load_line())
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
