"""The child side of ``trainer.tasks.reward_process``: load one reward function and
score the pairs the trainer sends, one JSON line per answer.

    python -m trainer.tasks.reward_child --path pkg.mod:fn --fd N --parent PID [--defined-in-module]

Only this process imports the function's module. It asks Linux to end it when
the trainer (``--parent``) dies, and stops at the end of its socket.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import numbers
import os
import signal
import socket
import sys
from collections.abc import Callable

from trainer.reward_functions import parse_reward_path

PR_SET_PDEATHSIG = 1


def load_callable(path: str) -> Callable[..., object]:
    """The function an import path names (imports its module: the child only).
    ValueError saying what is wrong."""
    parsed = parse_reward_path(path)
    try:
        module = importlib.import_module(parsed.module)
    except ImportError as exc:
        raise ValueError(f"cannot import {parsed.module!r}: {exc}") from None
    fn = getattr(module, parsed.function, None)
    if not callable(fn):
        raise ValueError(f"{parsed.module!r} has no function {parsed.function!r}")
    return fn


def _serve(path: str, fd: int, defined_in_module: bool) -> None:
    sock = socket.socket(fileno=fd)
    out = sock.makefile("wb")

    def answer(message: dict) -> None:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

    try:
        fn = load_callable(path)
        module = parse_reward_path(path).module
        if defined_in_module and getattr(fn, "__module__", None) != module:
            raise ValueError(
                f"{path!r} is not defined in {module} (it comes from "
                f"{getattr(fn, '__module__', '?')}); name it by its own module"
            )
    except Exception as exc:  # the message goes back to the trainer as the field error
        answer({"error": str(exc)})
        return
    answer({"ready": True})
    for line in sock.makefile("rb"):
        for response, gold in json.loads(line)["pairs"]:
            try:
                value = fn(response, gold)
            except Exception as exc:
                answer({"error": f"raised {type(exc).__name__}: {str(exc)[:2000]}"})
                continue
            if not isinstance(value, numbers.Real):  # bool counts: True is 1
                answer({"error": f"returned {str(value)[:200]!r}, not a number"})
                continue
            answer({"value": float(value)})  # NaN and inf travel as JSON's NaN / Infinity


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer.tasks.reward_child")
    parser.add_argument("--path", required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--defined-in-module", action="store_true")
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError, AttributeError):  # not Linux: EOF still ends it
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != args.parent:
        sys.exit(1)  # the trainer died before the request took effect
    _serve(args.path, args.fd, args.defined_in_module)


if __name__ == "__main__":
    main()
