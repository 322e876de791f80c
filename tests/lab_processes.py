"""A real platform in separate processes for end-to-end tests: ``LabStack``.

Shared by tests/platform (the queue end to end) and tests/e2e (the browser
tests); a plain module on the test path (pyproject's pythonpath lists
``tests``), since every test folder's conftest is called ``conftest``.
"""

from __future__ import annotations

import contextlib
import json as _json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from lab.jobs import launch

# A config the real trainer finishes in seconds on a CPU.
TINY_OVERRIDES = {
    "run.steps": 3,
    "run.threads": 1,
    "run.checkpoint_every": 1,
    "warm_start.max_steps": 2,
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 4,
}


def submit_tiny_run(owner, experiment, overrides: dict | None = None, **kw):
    """A queued moe-grpo run of ``experiment`` with ``TINY_OVERRIDES`` plus ``overrides``
    (other keyword arguments go to ``runs.lifecycle.submit_run``)."""
    from lab.runs.lifecycle import submit_run

    return submit_run(
        owner=owner, experiment=experiment, preset="moe-grpo",
        overrides={**TINY_OVERRIDES, **(overrides or {})}, **kw,
    )  # fmt: skip


# A test whose answer does not depend on the broker (the database decides: health
# rows, cancel flags, leases, the trainer's exit) runs on the embedded filesystem
# broker only; one about delivery (redelivery of a lost or unacknowledged message,
# a run given back, ordering) runs on both (the ``lab_stack`` fixture's default).
ONE_BROKER = pytest.mark.parametrize("lab_stack", ["filesystem"], indirect=True)


REDIS_URL = os.environ.get("LAB_TEST_REDIS_URL", "redis://127.0.0.1:6379/7")
PG_ADMIN_URL = os.environ.get("LAB_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def pg_up() -> bool:
    """Whether the PostgreSQL server of PG_ADMIN_URL answers (tests that need one skip)."""
    try:
        import psycopg

        psycopg.connect(
            PG_ADMIN_URL.replace("postgres://", "postgresql://"), connect_timeout=3
        ).close()
        return True
    except Exception:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_ok() -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping())
    except Exception:
        return False


def _manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        launch.manage_command(*args), env=env, cwd=launch.ROOT,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _new_user(env: dict[str, str]) -> str:
    """Create the stack's user ``e2e`` (password ``pw``); returns its API token."""
    out = _manage(env, "lab_user", "--username", "e2e", "--password", "pw", "--token-only")
    return out.strip().splitlines()[-1]


# This test process's migrated SQLite database with the user e2e, and its token.
_template: tuple[Path, str] | None = None


def _sqlite_template(env: dict[str, str]) -> tuple[Path, str]:
    """A migrated SQLite database holding the user ``e2e``, made once per test process
    and copied into every SQLite stack it starts: ``migrate`` and ``lab_user`` are two
    Django processes, about 7 CPU seconds, and a suite starts dozens of stacks. (A
    PostgreSQL stack migrates its own fresh database.)"""
    global _template
    if _template is None:
        folder = Path(os.environ.get("LAB_TEST_ROOT") or tempfile.mkdtemp()) / "stack-template"
        folder = folder / str(os.getpid())
        folder.mkdir(parents=True, exist_ok=True)
        db = folder / "db.sqlite3"
        own = {**env, "DATABASE_URL": f"sqlite:///{db}", "LAB_VAR_DIR": str(folder / "var"),
               "LAB_RUNS_DIR": str(folder / "var" / "runs")}  # fmt: skip
        _manage(own, "migrate", "-v0")
        _template = (db, _new_user(own))
    return _template


def _copy_sqlite(source: Path, dest: Path) -> None:
    """A consistent copy of a SQLite database (its WAL included), by SQLite's backup."""
    import sqlite3

    with (
        contextlib.closing(sqlite3.connect(source)) as src,
        contextlib.closing(sqlite3.connect(dest)) as dst,
    ):
        src.backup(dst)


def _has_children(pid: int) -> bool:
    """Whether the process has a live child (Linux: /proc/PID/task/*/children)."""
    try:
        return any(p.read_text().strip() for p in Path(f"/proc/{pid}/task").glob("*/children"))
    except OSError:
        return False


def _answer(body: bytes) -> dict:
    """An error's JSON body, or its text where the server answered otherwise (a proxy's
    or a crashed worker's page), so a failed assertion shows what came back."""
    try:
        return _json.loads(body or b"{}")
    except ValueError:
        return {"non_json_body": body[:2000].decode("utf-8", "replace")}


class LabStack:
    """A real platform: migrated DB, web server, Celery workers, on a real broker.

    Each stack has its own database (a SQLite file, or a fresh PostgreSQL
    database when the suite runs with DATABASE_URL=postgres://...), its own
    run folders and a unique queue name, so stacks never see each other's
    messages even on a shared Redis.
    """

    def __init__(self, root: Path, broker: str):
        self.root = root
        self.queue = f"cpu-{uuid.uuid4().hex[:8]}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.pg_db = None
        env = {
            "LAB_VAR_DIR": str(root / "var"),
            # its own run folders: another stack's run ids start at 1 too
            "LAB_RUNS_DIR": str(root / "var" / "runs"),
            "LAB_QUEUES": self.queue,
            "LAB_DEFAULT_QUEUE": self.queue,
            "LAB_HEARTBEAT_S": "0.5",
            "LAB_POLL_S": "0.2",
            "LAB_STALE_AFTER_S": "4",
            # A trainer stops when its worker has not renewed its lease for 3 s: a
            # frozen worker's trainer is gone before the run is handed on (4 s).
            "LAB_LEASE_S": "3",
            "LAB_RECONCILE_EVERY_S": "1",
            "DJANGO_DEBUG": "1",
        }
        db_url = os.environ.get("DATABASE_URL", "")
        if db_url.startswith("postgres"):
            self.pg_db = f"lab_e2e_{uuid.uuid4().hex[:10]}"
            self._pg(f'CREATE DATABASE "{self.pg_db}"')
            env["DATABASE_URL"] = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + self.pg_db
        else:
            env["DATABASE_URL"] = f"sqlite:///{root / 'var' / 'db.sqlite3'}"
        if broker == "redis":
            env["CELERY_BROKER_URL"] = REDIS_URL
        else:
            env["CELERY_BROKER_URL"] = "filesystem://"
        self.env = launch.process_env(env)
        (root / "var").mkdir(parents=True, exist_ok=True)
        if self.pg_db:
            self.manage("migrate", "-v0")
            self.token = _new_user(self.env)
        else:
            template, self.token = _sqlite_template(self.env)
            _copy_sqlite(template, root / "var" / "db.sqlite3")
        self.port = _free_port()
        self.start("web", launch.web_command("127.0.0.1", self.port))
        self.wait_for(lambda: self._up(), 60, "web server")

    @staticmethod
    def _pg(sql: str) -> None:
        import psycopg

        with psycopg.connect(
            PG_ADMIN_URL.replace("postgres://", "postgresql://"), autocommit=True
        ) as c:
            c.execute(sql)

    def manage(self, *args: str) -> str:
        return _manage(self.env, *args)

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - closed by the process's end
        proc = subprocess.Popen(
            cmd, env=self.env, cwd=launch.ROOT, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.procs[name] = proc
        return proc

    def start_worker(self, name: str = "w1") -> subprocess.Popen:
        return self.start(name, launch.worker_command([self.queue], f"{name}@e2e"))

    def start_reconciler(self) -> subprocess.Popen:
        return self.start("reconciler", launch.reconciler_command(self.root / "beat-schedule"))

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(sig)
        proc.wait(timeout=60)

    def freeze(self, *pids: int, attempts: int = 50) -> None:
        """SIGSTOP ``pids`` at a moment none of them holds the SQLite write lock.

        SQLite has one write lock per file and no server to take it back: a
        process stopped inside a write transaction stalls every other process
        until it resumes (docs/platform.md). The fault these tests inject is a
        frozen worker, not a frozen database, so on SQLite the stop is retried
        until a probe can take the lock. PostgreSQL needs no probe: its server
        ends a transaction left idle (``idle_in_transaction_session_timeout``).
        """
        for _ in range(attempts):
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            if self.pg_db or self._sqlite_writable():
                return
            for pid in reversed(pids):
                os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
        pytest.fail(f"processes {pids} held the SQLite write lock {attempts} times in a row")

    def _sqlite_writable(self) -> bool:
        import sqlite3

        db = sqlite3.connect(self.root / "var" / "db.sqlite3", timeout=0.5, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            db.close()

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    # HTTP -------------------------------------------------------------------
    def _up(self) -> bool:
        try:
            self.get("/api/presets")
            return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):  # a slow first answer
            return False

    def request(self, method: str, path: str, payload=None) -> tuple[int, dict]:
        data = _json.dumps(payload).encode() if payload is not None else None
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json",
                     "Accept": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                body = resp.read()
                return resp.status, _json.loads(body) if body else {}
        except urllib.error.HTTPError as exc:
            return exc.code, _answer(exc.read())

    def get(self, path: str) -> dict:
        code, body = self.request("GET", path)
        assert code == 200, (code, body)
        return body

    def post(self, path: str, payload=None) -> dict:
        code, body = self.request("POST", path, payload or {})
        assert code in (200, 201), (code, body)
        return body

    def run(self, run_id: int) -> dict:
        return self.get(f"/api/runs/{run_id}")

    def wait_for(self, predicate, timeout: float, what: str, every: float = 0.2):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            for name, proc in self.procs.items():
                if name != "web" and proc.poll() is not None and what != f"{name} exit":
                    pytest.fail(f"{name} died:\n{self.log(name)}")
            time.sleep(every)
        logs = "\n".join(f"--- {n}\n{self.log(n)}" for n in self.procs)
        pytest.fail(f"timed out waiting for {what}\n{logs}")

    def wait_status(self, run_id: int, statuses: set[str], timeout: float = 120) -> dict:
        return self.wait_for(
            lambda: (r := self.run(run_id))["status"] in statuses and r, timeout,
            f"run {run_id} to reach {statuses}",
        )  # fmt: skip

    def close(self) -> None:
        """Stop every process of the stack: SIGTERM to each process group at once, then
        SIGKILL to any still there after 20 s. A process with no child left (an idle
        worker: no trainer to hand back) is killed after 1 s: an idle Celery worker on
        the filesystem broker spends 4-5 s finishing its broker poll after SIGTERM,
        which a stack's teardown has no reason to wait for."""
        procs = [p for p in self.procs.values() if p.poll() is None]
        self.procs.clear()
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        began = time.monotonic()
        while procs:
            waited = time.monotonic() - began
            for proc in list(procs):
                if proc.poll() is not None:
                    procs.remove(proc)
                elif waited > 20 or (waited > 1 and not _has_children(proc.pid)):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    procs.remove(proc)
            time.sleep(0.05)
        if self.pg_db:
            self._pg(f'DROP DATABASE IF EXISTS "{self.pg_db}" WITH (FORCE)')
