"""Reward-function modules written for a test: a file in a temporary folder that a
child process (the reward function's own process) can import through PYTHONPATH."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path


def write_reward_module(folder: Path, name: str, source: str, monkeypatch) -> str:
    """Write ``folder/name.py`` and put ``folder`` on PYTHONPATH for child processes
    (and this one's sys.path); returns the module name."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{folder}{os.pathsep}{path}" if path else str(folder))
    return name
