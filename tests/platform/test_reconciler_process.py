"""The reconciler's scheduler (Celery beat, a forked child of the ``control``
worker) dies with its worker: ``kill -9`` of the worker leaves no orphan
scheduler sending ticks, so a restarted reconciler is the only one."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lab.jobs import launch

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def test_kill_9_of_the_reconciler_takes_its_scheduler_with_it(tmp_path):
    var = tmp_path / "var"
    var.mkdir()
    env = launch.process_env(
        {
            "LAB_VAR_DIR": str(var),
            "DATABASE_URL": f"sqlite:///{var / 'db.sqlite3'}",
            "CELERY_BROKER_URL": "filesystem://",
            "LAB_RECONCILE_EVERY_S": "1",
        }
    )
    subprocess.run(
        launch.manage_command("migrate", "-v0"), env=env, cwd=launch.ROOT, check=True, timeout=400
    )
    log = open(tmp_path / "reconciler.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        launch.reconciler_command(var / "beat-schedule"), env=env, cwd=launch.ROOT,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    beat = None
    try:
        (beat,) = _wait(lambda: _children(proc.pid), 300, "the embedded beat process")
        _wait(lambda: "Scheduler: Sending due task" in (tmp_path / "reconciler.log").read_text(),
              120, "a first tick")  # fmt: skip
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        _wait(lambda: not _alive(beat), 10, f"the orphaned beat process {beat} to exit")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if beat is not None and _alive(beat):  # never leave an orphan behind
            os.kill(beat, signal.SIGKILL)
        log.close()


def test_kill_9_of_the_scheduler_shows_in_health_and_stops_the_reconciler(tmp_path):
    """The beat child alone killed: the control worker would stay up and send no
    reconcile. /api/health names the dead scheduler, and the worker stops itself
    so that whatever supervises it (make up, docker-compose) sees it go."""
    from lab_processes import LabStack

    stack = LabStack(tmp_path, "filesystem")
    try:
        reconciler = stack.start_reconciler()
        health = _wait(
            lambda: (h := stack.request("GET", "/api/health")[1])["reconciler"]["ok"] and h,
            300, "a healthy reconciler",
        )  # fmt: skip
        beat = health["reconciler"]["beat_pid"]
        assert beat in _children(reconciler.pid)
        os.kill(beat, signal.SIGKILL)
        code, body = _wait(
            lambda: (r := stack.request("GET", "/api/health"))[1]["reconciler"].get("error") and r,
            30, "/api/health to report the scheduler",
        )  # fmt: skip
        assert code == 503 and not body["reconciler"]["ok"]
        assert f"celery beat, pid {beat}" in body["reconciler"]["error"]
        assert reconciler.wait(timeout=60) is not None  # stopped itself
        assert "the reconciler's scheduler" in stack.log("reconciler")
        stack.procs.pop("reconciler")
    finally:
        stack.close()


def test_make_up_stops_everything_when_the_scheduler_dies(tmp_path):
    port = launch_port()
    env = launch.process_env({"LAB_VAR_DIR": str(tmp_path / "var")})
    for name in ("DATABASE_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    up = subprocess.Popen(
        launch.manage_command("lab_up", "--port", str(port), "--no-study", "--workers", "1"),
        cwd=launch.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        reconciler = _wait(
            lambda: next((p for p in _children(up.pid) if b"-B" in _cmdline(p)), None),
            300, "the reconciler",
        )  # fmt: skip
        (beat,) = _wait(lambda: _children(reconciler), 300, "its scheduler")
        _wait(lambda: "Sending due task" in (tmp_path / "var" / "reconciler.log").read_text(),
              120, "a first tick")  # fmt: skip
        os.kill(beat, signal.SIGKILL)
        assert up.wait(timeout=120) == 1
        out = up.stdout.read()
        assert "stopped everything: reconciler exited" in out and "scheduler" in out, out
        with pytest.raises(OSError):
            import urllib.request

            urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=3)
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(timeout=120)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def launch_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
