"""The child's side of a bounded child process (see ``trainer.sandbox``).

    def main():
        args = child_arguments(parser)        # --fd, --parent (and the module's own)
        serve(args.fd, on_first, on_request)  # one JSON answer per JSON request

``child_arguments`` also asks Linux to kill this process when its parent dies
(PR_SET_PDEATHSIG) and caps its address space (``--memory-mb``), so a
``"x" * 10**10`` is a MemoryError answered as an error, not a swapping host.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1


def child_arguments(parser: argparse.ArgumentParser, argv: list[str] | None = None):
    """Parse ``--fd``, ``--parent`` and ``--memory-mb`` (plus the module's own), tie
    this process to its parent and cap its memory."""
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--memory-mb", type=int, default=0, help="address-space cap; 0 = none")
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the socket's end still ends it
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != args.parent:
        sys.exit(1)  # the parent died before the request took effect
    if args.memory_mb:
        limit = args.memory_mb * 1024 * 1024
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return args


def serve(
    fd: int,
    on_first: Callable[[dict[str, Any]], dict[str, Any]],
    on_request: Callable[[dict[str, Any]], dict[str, Any]],
) -> None:
    """Answer the first message with ``on_first`` (an ``{"error": ...}`` answer ends
    the child), then every request with ``on_request``, until the socket closes."""
    sock = socket.socket(fileno=fd)
    out = sock.makefile("wb")

    def answer(message: dict[str, Any]) -> None:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

    lines = sock.makefile("rb")
    first = lines.readline()
    if not first:
        return
    ready = on_first(json.loads(first))
    answer(ready)
    if "error" in ready:
        return
    for line in lines:
        answer(on_request(json.loads(line)))
