"""Guards that keep two trainers from ever writing one run folder.

- ``RunDirLock``: an OS lock (``fcntl.flock``) on ``RUN_DIR/.lock`` held for the
  trainer's whole life. The kernel drops it when the process dies, however it
  dies, so a crashed trainer never leaves a stale lock; a second trainer on
  the same folder fails to take it and exits at once with
  ``RUN_DIR_BUSY_EXIT_CODE``.
- ``Lease``: the supervisor (the platform's worker) touches a lease file each
  time it heartbeats. When the file is older than the lease, the supervisor is
  frozen or has lost the run, and the trainer stops at its next check (every
  RL step and every warm-start step) with ``LEASE_EXPIRED_EXIT_CODE`` and no
  checkpoint, before the platform hands the run to another attempt.

- ``die_with_launcher``: a rank started by torchrun dies with torchrun's agent.
  The platform kills the agent when its worker dies (PR_SET_PDEATHSIG), and a
  rank that outlived it would keep a gang's collectives alive with nobody
  supervising it; a lost worker must look like a lost host.

No Django here: the trainer only knows a file path and a number of seconds.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import time
from pathlib import Path

LOCK_FILE = ".lock"
# sysexits' EX_CANTCREAT: the run folder is held by another trainer.
RUN_DIR_BUSY_EXIT_CODE = 73
# The supervisor stopped renewing the lease: this attempt is over, another may take the run.
LEASE_EXPIRED_EXIT_CODE = 76


class RunDirBusy(RuntimeError):
    """Another live process holds the run folder's lock."""


class LeaseExpired(RuntimeError):
    """The supervisor stopped renewing this trainer's lease."""


class RunDirLock:
    """Exclusive, non-blocking ``flock`` on ``RUN_DIR/.lock`` (a context manager)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if os.environ.get("RANK", "0") != "0":
            # torchrun's other ranks belong to the same attempt as rank 0, which
            # holds the lock for all of them (torchrun sets RANK per process).
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise RunDirBusy(
                f"run folder {self.path.parent} is in use by another trainer (pid {holder})"
            ) from None
        # Who holds it, for the error message of a trainer that finds it taken.
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def run_dir_is_locked(run_dir: Path) -> bool:
    """True while some process holds ``RUN_DIR/.lock`` (probes without keeping it)."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no lock file (or no folder): nobody holds it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the probe's own lock
    return False


class Lease:
    """A file whose modification time the supervisor renews; ``check`` raises when stale.

    ``path=None`` is the CLI without a supervisor: never expires.
    """

    def __init__(self, path: Path | None, seconds: float):
        self.path = Path(path) if path is not None else None
        self.seconds = seconds

    def age(self) -> float:
        """Seconds since the last renewal (infinite when the file is gone)."""
        if self.path is None:
            return 0.0
        try:
            return time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return float("inf")

    def check(self) -> None:
        if self.path is not None and self.age() > self.seconds:
            raise LeaseExpired(
                f"lease {self.path} not renewed for {self.age():.1f} s "
                f"(lease {self.seconds:g} s): the supervisor is gone or lost the run"
            )


def renew_lease(path: Path) -> None:
    """The supervisor's side: create or touch the lease file."""
    path.touch()
    os.utime(path)


PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_launcher() -> None:
    """Under torchrun (``LOCAL_RANK`` set), have Linux SIGKILL this rank when its
    launcher dies; exit at once if it already has. A no-op elsewhere."""
    if "LOCAL_RANK" not in os.environ:
        return
    launcher = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: ranks end at the collective timeout
        return
    if os.getppid() != launcher:  # the launcher died before the request took effect
        os._exit(1)
