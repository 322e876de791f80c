"""The child side of ``trainer.tasks.reward_process``: load one reward function and
score the pairs the trainer sends, one JSON answer per pair.

    python -m trainer.tasks.reward_child --fd N --parent PID

Only this process imports the function's module (a ``trainer.sandbox`` child:
it dies with the trainer). The first message names the function
(``{"path", "defined_in_module"}``); each later one is ``{"response", "answer"}``.
"""

from __future__ import annotations

import argparse
import importlib
import numbers
from collections.abc import Callable
from typing import Any

from trainer.reward_functions import parse_reward_path
from trainer.sandbox.serve import child_arguments, serve


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


class _Scorer:
    fn: Callable[..., object]

    def load(self, first: dict[str, Any]) -> dict[str, Any]:
        path = str(first.get("path"))
        try:
            fn = load_callable(path)
            module = parse_reward_path(path).module
            if first.get("defined_in_module") and getattr(fn, "__module__", None) != module:
                raise ValueError(
                    f"{path!r} is not defined in {module} (it comes from "
                    f"{getattr(fn, '__module__', '?')}); name it by its own module"
                )
        except Exception as exc:  # the message goes back to the trainer as the field error
            return {"error": str(exc)}
        self.fn = fn
        return {"ready": True}

    def score(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            value = self.fn(request["response"], request["answer"])
        except Exception as exc:
            return {"error": f"raised {type(exc).__name__}: {str(exc)[:2000]}"}
        if not isinstance(value, numbers.Real):  # bool counts: True is 1
            return {"error": f"returned {str(value)[:200]!r}, not a number"}
        return {"value": float(value)}  # NaN and inf travel as JSON's NaN / Infinity


def main(argv: list[str] | None = None) -> None:
    args = child_arguments(
        argparse.ArgumentParser(prog="python -m trainer.tasks.reward_child"), argv
    )
    scorer = _Scorer()
    serve(args.fd, scorer.load, scorer.score)


if __name__ == "__main__":
    main()
