"""`manage.py lab_up --check` (`make up UP_ARGS=--check`, run by CI before
`make test`): the lab that one command starts works, and stops as Ctrl-C
stops it.

Working: every process stays up, the web server answers, each CPU worker
slot heartbeats on the default queue, and (when runs wait) a worker claims one
and its trainer reports its phase (warm start or training). Stopped well:
every process exited, no run is left running, and a run that was training
went back to the queue with its attempt given back (``lab/jobs/outcome.py``,
"shutdown"), so the next `make up` resumes it; none failed.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from lab.jobs.models import Worker
from lab.runs.models import Run, RunStatus

# Generous: a CI machine imports torch in every worker and trainer at once.
CHECK_TIMEOUT_S = float(os.environ.get("LAB_UP_CHECK_TIMEOUT_S", 300))
POLL_S = 1.0

Procs = list[tuple[str, subprocess.Popen]]


@dataclass
class Started:
    since: datetime
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    training: dict[int, int] = field(default_factory=dict)  # run id -> its max_attempts then


def wait_until_working(procs: Procs, slots: int, var: Path, url: str) -> Started:
    """Poll until the lab works or ``CHECK_TIMEOUT_S`` passes; what was seen."""
    started = Started(since=timezone.now())
    deadline = time.monotonic() + CHECK_TIMEOUT_S
    waiting_runs = Run.objects.filter(status=RunStatus.QUEUED).exists()
    web = workers = trained = False
    while time.monotonic() < deadline:
        close_old_connections()
        dead = [
            f"{name} exited with {p.returncode} (see {var}/{name}.log)"
            for name, p in procs
            if p.poll() is not None
        ]
        if dead:
            started.problems += dead
            return started
        web = web or _answers(url + "accounts/login/")
        workers = workers or _live_slots(started.since) >= slots
        running = Run.objects.filter(status=RunStatus.RUNNING).exclude(phase="")
        trained = trained or running.exists() or not waiting_runs
        if web and workers and trained:
            started.training = dict(running.values_list("pk", "max_attempts"))
            started.notes.append(
                f"web answered, {slots} worker slot(s) live, "
                + (
                    f"run(s) {sorted(started.training)} training"
                    if waiting_runs
                    else "no run waiting to train"
                )
            )
            return started
        time.sleep(POLL_S)
    missing = [
        what
        for what, ok in (
            ("the web server's answer", web),
            (f"{slots} live worker slot(s)", workers),
            ("a training run", trained),
        )
        if not ok
    ]
    started.problems.append(f"after {CHECK_TIMEOUT_S:.0f} s still no {', no '.join(missing)}")
    return started


def problems_after_stop(procs: Procs, started: Started) -> list[str]:
    """What a clean stop must leave: every process gone, no run running or failed,
    and the runs that trained back in the queue with their attempt given back."""
    close_old_connections()
    problems = [f"{name} still running after the stop" for name, p in procs if p.poll() is None]
    running = list(Run.objects.filter(status=RunStatus.RUNNING).values_list("pk", flat=True))
    if running:
        problems.append(f"run(s) {running} left running: their worker did not give them back")
    failed = Run.objects.filter(status=RunStatus.FAILED, finished_at__gte=started.since)
    for pk, error in failed.values_list("pk", "error"):
        problems.append(f"run {pk} failed: {error.strip().splitlines()[-1:] or ['?']}")
    for pk, status, max_attempts, error in Run.objects.filter(
        pk__in=list(started.training)
    ).values_list("pk", "status", "max_attempts", "error"):
        if status != RunStatus.QUEUED or max_attempts != started.training[pk] + 1:
            problems.append(
                f"run {pk} ({status}) was not given back unspent on the stop: {error[:300]}"
            )
    return problems


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5).read()
        return True
    except OSError:
        return False


def _live_slots(since: datetime) -> int:
    """Workers of the default queue that heartbeat since the check began."""
    live = Worker.objects.filter(last_seen__gte=since)
    return sum(
        1
        for queues in live.values_list("queues", flat=True)
        if settings.LAB_DEFAULT_QUEUE in queues
    )
