"""Resumable checkpoints: everything needed to continue a run bit-for-bit.

A checkpoint holds the policy, the frozen reference, the optimiser, every RNG
the loop draws from, the step, and the state of the stateful controllers
(collapse detector, reward normaliser, ...). It is written to a temporary file
and renamed, so a crash mid-write never leaves a truncated ``last.pt``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "last.pt"


def checkpoint_path(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / CHECKPOINT_NAME


def rng_state(py_rng: random.Random, generators: dict[str, torch.Generator]) -> dict[str, Any]:
    return {
        "python": py_rng.getstate(),
        "torch": torch.get_rng_state(),
        "generators": {name: g.get_state() for name, g in generators.items()},
    }


def restore_rng(
    state: dict[str, Any], py_rng: random.Random, generators: dict[str, torch.Generator]
) -> None:
    py_rng.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    for name, g in generators.items():
        g.set_state(state["generators"][name])


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> Path:
    """Atomically write ``state`` as the run's last checkpoint."""
    path = checkpoint_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    path = checkpoint_path(run_dir)
    if not path.exists():
        return None
    # weights_only=False: the state holds Python RNG tuples and plain dicts we wrote ourselves.
    return torch.load(path, map_location="cpu", weights_only=False)
