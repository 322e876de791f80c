"""A custom reward function run in its own process, with a time bound per call.

    scorer = RewardProcess("mylab.rewards:score", timeout_s=10.0)
    scorer.start()                      # ValueError: not offered, cannot import, no such function
    scorer.score([(response, answer), ...])   # [float | None, ...]; None = over the bound
    scorer.close()

Why a process of its own: the function is code a researcher wrote; the
trainer (and never the web server) runs it, and a call that hangs (a symbolic
simplifier on a pathological answer), exits or replaces the process cannot
take the run with it unnoticed. The child is started with the trainer's
interpreter (``python -m trainer.tasks.reward_child``), talks over a socket
pair (one JSON line per message; the function's own prints go to the
trainer's log), dies with the trainer (Linux PR_SET_PDEATHSIG), and runs in
its own process group so that a call over the bound is ended with everything
it started (SIGKILL to the group); the next call starts a fresh child.

A batch is pipelined: the child answers each pair as soon as it is scored, and
each answer must come within ``timeout_s`` of the previous one. A call over
the bound scores None (the caller scores it 0 and counts it); the rest of the
batch is sent again to the fresh child. A function that raises, returns no
number, or whose process ends mid-call is a ``RewardFunctionError``: the run
fails with that message, since retrying cannot fix it.

Which functions may run is ``trainer.reward_functions``' rule,
checked here before the child starts, and in the child (a module entry
offers only functions defined in that module).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from trainer.reward_functions import environment_entries, parse_reward_path, permit

LOAD_TIMEOUT_S = 120.0  # importing the module (it may load its own libraries)
_MAX_LINE = 1 << 20  # one answer line from the child: a JSON number or a short message


class RewardFunctionError(ValueError):
    """The reward function failed in a way a retry cannot fix (the message says how)."""


class RewardProcess:
    """The client side: start, score batches, close (see the module docstring)."""

    def __init__(self, path: str, timeout_s: float, load_timeout_s: float = LOAD_TIMEOUT_S):
        self.path = path
        self.timeout_s = float(timeout_s)
        self.load_timeout_s = float(load_timeout_s)
        self.timeouts = 0  # calls over the bound, over this object's life
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._buffer = b""

    # ----------------------------------------------------------- life
    def start(self) -> None:
        """Start the child and load the function; ValueError saying why it cannot run."""
        if self._proc is not None:
            return
        entries = environment_entries()
        module_entry = False
        if entries is None:
            parse_reward_path(self.path)  # syntax only: the trainer run by hand
        else:
            module_entry = permit(self.path, entries).module_entry
        ours, theirs = socket.socketpair()
        cmd = [
            sys.executable,
            "-m",
            "trainer.tasks.reward_child",
            "--path",
            self.path,
            "--fd",
            str(theirs.fileno()),
            "--parent",
            str(os.getpid()),
        ]
        if module_entry:
            cmd.append("--defined-in-module")
        try:
            self._proc = subprocess.Popen(
                cmd,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: a timeout kills what it started too
            )
        finally:
            theirs.close()
        self._sock, self._buffer = ours, b""
        try:
            ready = self._read(self.load_timeout_s)
        except TimeoutError:
            self.close()
            raise ValueError(
                f"{self.path!r} did not load within {self.load_timeout_s:g} s"
            ) from None
        except RewardFunctionError as exc:
            self.close()
            raise ValueError(str(exc)) from None
        if "error" in ready:
            self.close()
            raise ValueError(ready["error"])

    def close(self) -> None:
        """End the child (and anything it started); safe to call twice."""
        proc, sock = self._proc, self._sock
        self._proc = self._sock = None
        if sock is not None:
            sock.close()
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __del__(self) -> None:  # a task dropped without close(): no orphan child
        with contextlib.suppress(Exception):
            self.close()

    # ----------------------------------------------------------- scoring
    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float | None]:
        """``fn(response, answer)`` for each pair, in order; None for a call over the bound."""
        out: list[float | None] = []
        while len(out) < len(pairs):
            self.start()
            rest = pairs[len(out) :]
            self._send({"pairs": [list(p) for p in rest]})
            for _ in rest:
                try:
                    reply = self._read(self.timeout_s)
                except TimeoutError:
                    self.timeouts += 1
                    self.close()  # a fresh child takes the rest of the batch
                    out.append(None)
                    break
                if "error" in reply:
                    self.close()  # its answers to the rest of the batch are not wanted
                    raise RewardFunctionError(f"{self.path}: {reply['error']}")
                out.append(float(reply["value"]))
        return out

    # ----------------------------------------------------------- wire
    def _send(self, message: dict) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            raise RewardFunctionError(self._ended()) from None

    def _read(self, timeout_s: float) -> dict:
        """The next JSON line from the child within ``timeout_s`` (TimeoutError)."""
        assert self._sock is not None
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            readable, _, _ = select.select([self._sock], [], [], left)
            if not readable:
                continue
            chunk = self._sock.recv(65536)
            if not chunk:
                raise RewardFunctionError(self._ended())
            self._buffer += chunk
            if len(self._buffer) > _MAX_LINE:
                raise RewardFunctionError(f"{self.path}: its process sent an oversized answer")
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _ended(self) -> str:
        code = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(timeout=5)
        self.close()
        return f"the process running {self.path} ended mid-call (exit status {code})"
