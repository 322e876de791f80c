"""A real ``mlflow server`` (SQLite backend, proxied artifacts in a folder) on a free
port, for tests that run the same client script against it and against the lab.
A plain module on the test path (pyproject's pythonpath lists ``tests``)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_server_available() -> bool:
    """Whether the full ``mlflow`` package (the server, not only mlflow-skinny) is here."""
    import importlib.util

    return (
        importlib.util.find_spec("mlflow.server") is not None
        and shutil.which("mlflow", path=str(Path(sys.executable).parent)) is not None
    )


class MlflowServer:
    """``mlflow server`` in its own process group; ``uri`` once it answers /health."""

    def __init__(self, root: Path, timeout_s: float = 180):
        root.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        exe = str(Path(sys.executable).parent / "mlflow")
        self.log_path = root / "mlflow-server.log"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_TOKEN": ""}
        self.proc = subprocess.Popen(
            [
                exe, "server",
                "--backend-store-uri", f"sqlite:///{root / 'mlflow.sqlite'}",
                "--artifacts-destination", str(root / "mlflow-artifacts"),
                "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
            ],
            stdout=self.log_path.open("w"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.close()
        raise RuntimeError(f"mlflow server did not start: {self.log_path.read_text()[-2000:]}")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
