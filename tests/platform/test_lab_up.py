"""`make up` (manage.py lab_up): the embedded default starts, queues the
demo (a part of the quick stability study), one worker slot per core, serves
the login page, and Ctrl-C stops every process."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.request

import pytest
from lab_processes import submit_tiny_run

from lab.jobs import launch

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lab_up_starts_everything_and_ctrl_c_stops_it(tmp_path):
    port = _port()
    # The embedded default, whatever database the rest of the suite uses.
    env = launch.process_env({"LAB_VAR_DIR": str(tmp_path / "var")})
    for name in ("DATABASE_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    proc = subprocess.Popen(
        launch.manage_command("lab_up", "--port", str(port), "--steps", "2", "--workers", "2"),
        cwd=launch.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops everything" in line:
            break
    out = "".join(lines)
    assert f"is up: http://127.0.0.1:{port}/" in out, out
    assert "login: demo / " in out and "queued 'Demo: MoE collapse" in out and ": 12 runs" in out
    assert "workers: 2 CPU slots, one thread each" in out
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=10).read()
    assert b"Log in" in page
    # Anonymous pages redirect to the login page.
    resp = urllib.request.urlopen(f"http://127.0.0.1:{port}/queue/", timeout=10)
    assert "/accounts/login/" in resp.url
    for name in ("web", "worker", "worker1", "reconciler"):
        assert (tmp_path / "var" / f"{name}.log").exists()

    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 0
    assert "stopped." in proc.stdout.read()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=3)
    count = subprocess.run(
        launch.manage_command("shell", "-c", "from lab.runs.models import Run; print(Run.objects.count())"),
        cwd=launch.ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    assert count == "12"


def test_lab_up_check_starts_trains_a_demo_run_and_stops_it_unspent(tmp_path):
    """CI's `make up UP_ARGS=--check`: up, a demo run trains, stop, judged."""
    env = launch.process_env({"LAB_VAR_DIR": str(tmp_path / "var")})
    for name in ("DATABASE_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    done = subprocess.run(
        launch.manage_command("lab_up", "--check", "--port", str(_port()), "--workers", "1"),
        cwd=launch.ROOT, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "1 worker slot(s) live, run(s) [1] training" in out
    assert "check passed" in out
    state = subprocess.run(
        launch.manage_command("shell", "-c", "from lab.runs.models import Run; "
                              "r = Run.objects.get(pk=1); print(r.status, r.attempts, r.max_attempts)"),
        cwd=launch.ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    assert state == "queued 1 4"  # back in the queue, its attempt given back


def test_the_check_names_a_run_left_running_or_spent(db, user, experiment):
    from django.utils import timezone

    from lab.jobs import up_check
    from lab.runs.models import Run

    since = timezone.now()
    left = submit_tiny_run(user, experiment)
    spent = submit_tiny_run(user, experiment)
    Run.objects.filter(pk=left.pk).update(status="running")
    Run.objects.filter(pk=spent.pk).update(error="attempt 1 lost its worker; requeued")
    started = up_check.Started(since=since, training={left.pk: 3, spent.pk: 3})
    problems = up_check.problems_after_stop([], started)
    assert any(f"[{left.pk}] left running" in p for p in problems)
    assert any(f"run {spent.pk} (queued) was not given back unspent" in p for p in problems)
