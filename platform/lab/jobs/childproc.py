"""Child processes tied to the worker's life (no Django here: used by tests too)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

# Exec shim: ask Linux to SIGKILL this process when its parent (the worker)
# dies (PR_SET_PDEATHSIG survives exec), then become the trainer. A shim rather
# than preexec_fn, which is unsafe in a process with threads (the registry).
_PDEATHSIG_EXEC = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)\n"
    "except OSError:\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(75)  # the worker died before the trainer started\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def tied_to_this_process(cmd: list[str]) -> list[str]:
    """``cmd`` wrapped so that it dies with the current process (Linux)."""
    return [sys.executable, "-S", "-c", _PDEATHSIG_EXEC, str(os.getpid()), *cmd]


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    """Signal the child's whole process group (torchrun and its ranks included)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
