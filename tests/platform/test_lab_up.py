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
