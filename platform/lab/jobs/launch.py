"""Command lines of the platform's processes, shared by `manage.py lab_up`,
docker-compose.yml (same flags) and the end-to-end tests.

Worker per GPU (docs/design.md, "processes"): concurrency 1, prefetch 1,
solo pool (the task supervises a child process; cancel is a DB flag, so
revoke is never needed), CUDA_VISIBLE_DEVICES pins the GPU:

    CUDA_VISIBLE_DEVICES=0 PYTHONPATH=platform:. .venv/bin/celery -A lab.site worker \\
        -Q gpu-a100 -n gpu0@%h --pool solo --concurrency 1 --prefetch-multiplier 1
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the repository root


def process_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment with the checkout's own platform/ and root first on the path, so a
    worktree that is not installed runs its own code (platform/ is no package)."""
    paths = [str(ROOT / "platform"), str(ROOT)]
    old = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths + ([old] if old else []))}
    env.setdefault("DJANGO_SETTINGS_MODULE", "lab.site.settings")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def worker_command(queues: list[str], name: str, loglevel: str = "INFO") -> list[str]:
    return _celery_worker(queues, name, loglevel)


def reconciler_command(schedule_file: Path, name: str = "control@%h") -> list[str]:
    """Celery beat embedded in a small worker on the `control` queue: it schedules
    and runs jobs.tasks.reconcile every LAB_RECONCILE_EVERY_S seconds."""
    return _celery_worker(["control"], name, "INFO", beat=["-B", "-s", str(schedule_file)])


def _celery_worker(
    queues: list[str], name: str, loglevel: str, beat: list[str] | None = None
) -> list[str]:
    """One solo-pool worker taking one message at a time (a run is long; the solo pool
    is what cooperative cancel is built on), without gossip or mingle."""
    return [
        *(sys.executable, "-m", "celery", "-A", "lab.site", "worker", *(beat or [])),
        *("-Q", ",".join(queues), "-n", name, "--pool", "solo", "--concurrency", "1"),
        *("--prefetch-multiplier", "1", "--without-gossip", "--without-mingle"),
        *("-l", loglevel),
    ]


# The production WSGI server (as docker-compose.yml's web service), not Django's
# development server: threads per worker so a slow request (a registration that
# reads a checkpoint's headers) does not hold up the pages' polls.
WEB_WORKERS = 2
WEB_THREADS = 4
WEB_TIMEOUT_S = 120


def web_command(host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "lab.site.wsgi:application",
        "--bind",
        f"{host}:{port}",
        "--workers",
        str(WEB_WORKERS),
        "--threads",
        str(WEB_THREADS),
        "--worker-class",
        "gthread",
        "--timeout",
        str(WEB_TIMEOUT_S),
        "--graceful-timeout",
        "20",
        "--access-logfile",
        "-",
        "--error-logfile",
        "-",
    ]


def manage_command(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), *args]
