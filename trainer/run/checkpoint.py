"""Resumable checkpoints: everything needed to continue a run bit-for-bit.

A checkpoint holds the policy, the frozen reference, the optimiser, every RNG
the loop draws from, the step, and the state of the stateful controllers
(collapse detector, reward normaliser, ...). It is written to a temporary file
and renamed, so a crash mid-write never leaves a truncated ``last.pt``. The
temporary name is unique to the writing process (host and pid), so two
trainers that ever met in one folder could not interleave bytes in one file.

Over several ranks (trainer/distributed/) rank 0 writes ``last.pt`` with the
world size and every rank's RNG; under FSDP the model, the reference and the
optimiser are saved sharded with torch.distributed.checkpoint into
``sharded-step{N}/`` (every rank writes its shard) and ``last.pt`` names that
folder. A checkpoint resumes only with the world size that wrote it
(``check_world_size``): the per-rank sampling streams and, under DDP, nothing
else depend on it, but a resumed run must continue the same run.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
from pathlib import Path
from typing import Any

import torch

from trainer.distributed import DistContext

# checkpoint_path lives with the run folder's other names (torch-free, for the platform)
from trainer.run_folder.files import CHECKPOINT_DIR, CHECKPOINT_NAME, checkpoint_path  # noqa: F401


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
    tmp = path.with_name(f"{path.name}.{socket.gethostname()}-{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    path = checkpoint_path(run_dir)
    if not path.exists():
        return None
    # weights_only=False: the state holds Python RNG tuples and plain dicts we wrote ourselves.
    return torch.load(path, map_location="cpu", weights_only=False)


class WorldSizeMismatch(RuntimeError):
    """A checkpoint written by W ranks is resumed with a different number of ranks."""


def check_world_size(ckpt: dict[str, Any], dist: DistContext) -> None:
    """Refuse to resume with another world size than the checkpoint's (clear error)."""
    written = int(ckpt.get("world_size", 1))
    if written != dist.world_size:
        raise WorldSizeMismatch(
            f"the checkpoint was written by {written} rank(s) and this run has "
            f"{dist.world_size}: set run.gpus={written} to resume it (each rank's "
            "sampling stream is part of the run), or start a new run"
        )


def gather_objects(dist: DistContext, obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` (rank order), or None single-process. A collective."""
    if not dist.enabled:
        return None
    import torch.distributed as tdist

    objects: list[Any] = [None] * dist.world_size
    tdist.all_gather_object(objects, obj)
    return objects


def gather_rng_states(
    dist: DistContext, py_rng: random.Random, generators: dict[str, torch.Generator]
) -> list[dict[str, Any]] | None:
    """Every rank's ``rng_state`` (rank order), or None single-process. A collective."""
    if not dist.enabled:
        return None
    import torch.distributed as tdist

    states: list[Any] = [None] * dist.world_size
    tdist.all_gather_object(states, rng_state(py_rng, generators))
    return states


def _sharded_state(policy, reference, optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model_sd, optim_sd = get_state_dict(policy, optimizer)
    state: dict[str, Any] = {"policy": model_sd, "optimizer": optim_sd}
    if reference is not None:
        state["reference"] = get_model_state_dict(reference)
    return state


def save_sharded(run_dir: Path, step: int, policy, reference, optimizer) -> str:
    """FSDP: every rank writes its shards to ``checkpoints/sharded-step{step}``; returns
    the folder name for last.pt. Earlier sharded folders are removed once last.pt
    names the new one (``prune_sharded``), so a crash never leaves last.pt pointing
    at a half-written folder."""
    import torch.distributed.checkpoint as dcp

    name = f"sharded-step{step}"
    folder = run_dir / CHECKPOINT_DIR / name
    dcp.save(_sharded_state(policy, reference, optimizer), checkpoint_id=str(folder))
    return name


def prune_sharded(run_dir: Path, keep: str) -> None:
    for folder in (run_dir / CHECKPOINT_DIR).glob("sharded-step*"):
        if folder.name != keep:
            shutil.rmtree(folder, ignore_errors=True)


def load_sharded(run_dir: Path, name: str, policy, reference, optimizer) -> None:
    """Load ``save_sharded``'s folder into the sharded modules and optimiser (in place)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    state = _sharded_state(policy, reference, optimizer)
    dcp.load(state, checkpoint_id=str(run_dir / CHECKPOINT_DIR / name))
    set_state_dict(
        policy, optimizer, model_state_dict=state["policy"], optim_state_dict=state["optimizer"]
    )
    if reference is not None:
        set_model_state_dict(reference, state["reference"])


def read_sharded_policy(run_dir: Path, name: str) -> dict[str, torch.Tensor]:
    """The whole policy state_dict of a sharded (FSDP) checkpoint, read in one
    process without a process group (for ``trainer export``)."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp) / "merged.pt"
        dcp_to_torch_save(str(run_dir / CHECKPOINT_DIR / name), str(merged))
        return torch.load(merged, map_location="cpu", weights_only=False)["policy"]
