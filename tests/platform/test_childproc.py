"""The trainer child dies with its worker (real processes, kill -9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose (reaped by init later).
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_child_is_killed_when_its_parent_is_killed():
    parent_code = (
        "import subprocess, sys, time; sys.path.insert(0, 'platform');"
        "from lab.jobs.childproc import tied_to_this_process;"
        "p = subprocess.Popen(tied_to_this_process(['/bin/sleep', '60']), start_new_session=True);"
        "time.sleep(0.5); print(p.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    child_pid = int(parent.stdout.readline())
    assert _alive(child_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child_pid)
