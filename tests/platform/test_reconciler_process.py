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
