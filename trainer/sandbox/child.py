"""The parent's side of a bounded child process (see ``trainer.sandbox``).

    child = BoundedChild("trainer.hf.chat_child", ["--memory-mb", "1024"], what="the chat template")
    child.start(first={"source": text}, timeout_s=30)   # ChildError: it refused, died or hung
    child.call({"messages": [...]}, timeout_s=5)        # the answer; CallTimeout over the bound
    child.close()

One request, one answer: a call waits for its answer before the next is sent,
so neither side can block the other on a full socket buffer. A call over its
bound kills the child's whole process group (it runs in its own session) and
raises ``CallTimeout``; the next call starts a fresh child with the same first
message. An answer line over ``max_answer_bytes`` ends the child too.
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
from typing import Any


class ChildError(ValueError):
    """The child refused its first message, died mid-call, or answered garbage."""


class CallTimeout(TimeoutError):
    """A call ran over its time bound (the child was killed)."""


class BoundedChild:
    def __init__(
        self,
        module: str,
        args: list[str] | None = None,
        *,
        what: str,
        max_answer_bytes: int = 1 << 20,
    ):
        self.module = module
        self.args = list(args or [])
        self.what = what  # names the code in messages: "the chat template", "pkg.mod:fn"
        self.max_answer_bytes = max_answer_bytes
        self._first: dict[str, Any] | None = None
        self._first_timeout_s = 0.0
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._buffer = b""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # ----------------------------------------------------------- life
    def start(self, first: dict[str, Any] | None = None, timeout_s: float = 60.0) -> dict:
        """Start the child, send ``first`` (kept for restarts) and return its ready
        answer. ChildError with the child's own message when it refuses."""
        if first is not None:
            self._first, self._first_timeout_s = first, timeout_s
        if self._proc is not None:
            return {}
        ours, theirs = socket.socketpair()
        cmd = [sys.executable, "-m", self.module, "--fd", str(theirs.fileno())]
        cmd += ["--parent", str(os.getpid()), *self.args]
        try:
            self._proc = subprocess.Popen(
                cmd,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: a kill ends what it started too
            )
        finally:
            theirs.close()
        self._sock, self._buffer = ours, b""
        try:
            ready = self._exchange(self._first or {}, self._first_timeout_s or timeout_s)
        except CallTimeout:
            raise ChildError(
                f"{self.what} did not start within {self._first_timeout_s or timeout_s:g} s"
            ) from None
        if "error" in ready:
            self.close()
            raise ChildError(str(ready["error"]))
        return ready

    def close(self) -> None:
        """End the child and everything it started; safe to call twice."""
        proc, sock = self._proc, self._sock
        self._proc = self._sock = None
        if sock is not None:
            sock.close()
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __del__(self) -> None:  # dropped without close(): no orphan child
        with contextlib.suppress(Exception):
            self.close()

    # ----------------------------------------------------------- calls
    def call(self, message: dict[str, Any], timeout_s: float) -> dict:
        """Send ``message``, return the child's answer within ``timeout_s``."""
        self.start()
        return self._exchange(message, timeout_s)

    def _exchange(self, message: dict[str, Any], timeout_s: float) -> dict:
        assert self._sock is not None
        try:
            self._sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            raise ChildError(self._ended()) from None
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise CallTimeout(f"{self.what} took longer than {timeout_s:g} s")
            readable, _, _ = select.select([self._sock], [], [], left)
            if not readable:
                continue
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise ChildError(self._ended())
            self._buffer += chunk
            if len(self._buffer) > self.max_answer_bytes:
                self.close()
                raise ChildError(f"{self.what} answered more than {self.max_answer_bytes} bytes")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self.close()
            raise ChildError(f"{self.what}: its process answered something unreadable")
        return answer

    def _ended(self) -> str:
        code = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(timeout=5)
        self.close()
        return f"the process running {self.what} ended mid-call (exit status {code})"
