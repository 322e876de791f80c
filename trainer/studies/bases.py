"""Bases that travel: a study's warm-started bases as small files, keyed by content
and environment, exported once and imported instead of trained again.

A GPU slot starts on a bare machine: without its bases a study spends the slot
on warm starts (on the H200, 4 bases took most of a 100 s budget and 1 RL run of
4 finished). A study writes each base it used to ``OUT/bases/`` as two files:

* ``NAME.pt``: the warm-start cache entry itself (the state dict, held-out
  accuracy, SFT steps; ``trainer.run.warmstart``), fp32 as trained;
* ``NAME.json``: the manifest: the content key (``warm_start_key``: a hash of
  the model, task and warm_start sections, of the input files' contents and
  the vocabulary; on the CPU the thread count and the CPU), the environment it
  was trained in (device type, capability, the parameters' dtype; on the CPU
  the CPU's capability and identity, ``trainer.devices.environment.cpu_key``,
  and the thread count; the device name and torch build for the record), and
  the weights file's SHA-256.

``NAME`` is ``<content key>--<environment label>``, so bases of one config
trained on two kinds of machine sit side by side. ``trainer study ... --bases
DIR`` installs the base whose content key and environment both match into the
warm-start cache before the runs start, so they find it there. The same
config and seed train different bits on another kind of device (another
capability or dtype: other kernels, other sums), so a base from another
environment is refused, naming both, rather than passed off as this machine's
base; so is a file whose weights do not match its manifest. A base that DIR
does not hold is trained here (and exported).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from trainer.config import ExperimentConfig
from trainer.devices.capability import capability_label, device_capability
from trainer.devices.environment import cpu_key
from trainer.run.warmstart import cache_dir, warm_start_key

MANIFEST_FORMAT = 1


class BaseMismatch(Exception):
    """A base in the import folder that this machine must not use (the message says why)."""


def base_environment(device: torch.device, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Where a base was trained: the fields that must match (``MATCHED``) and, for
    the record, the device name and torch build."""
    dtypes = sorted(
        {str(t.dtype).removeprefix("torch.") for t in state.values() if t.is_floating_point()}
    )
    env: dict[str, Any] = {
        "device_type": device.type,
        "capability": capability_label(device_capability(device)),
        "dtype": ",".join(dtypes),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    if device.type == "cpu":
        env["cpu"] = cpu_key()  # torch's CPU capability and the processor's identity
        env["threads"] = torch.get_num_threads()
    return env


MATCHED = ("device_type", "capability", "dtype", "cpu", "threads")


def environment_label(env: dict[str, Any]) -> str:
    """``cuda-sm90-float32``, ``cpu-avx2-1a2b3c-t1-float32``: the environment part of a name."""
    if env["device_type"] == "cpu":
        return f"cpu-{env['cpu']}-t{env['threads']}-{env['dtype']}".lower()
    return f"{env['device_type']}-{env['capability']}-{env['dtype']}".lower()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export_base(cfg: ExperimentConfig, key: str, device: torch.device, dest: Path) -> Path:
    """Write the cached base ``key`` (trained or loaded by ``train_base_policy``) to
    ``dest`` with its manifest; returns the weights file. Once: an existing export
    of the same name is kept."""
    source = cache_dir() / f"{key}.pt"
    blob = torch.load(source, map_location="cpu", weights_only=False)
    env = base_environment(device, blob["state_dict"])
    name = f"{key}--{environment_label(env)}"
    weights = dest / f"{name}.pt"
    if weights.exists() and (dest / f"{name}.json").exists():
        return weights
    dest.mkdir(parents=True, exist_ok=True)
    tmp = weights.with_suffix(".tmp")
    shutil.copyfile(source, tmp)
    tmp.replace(weights)
    manifest = {
        "format": MANIFEST_FORMAT,
        "key": key,
        "content": {
            "config_hash": cfg.hash("model", "task", "warm_start"),
            "model": cfg.model.model_dump(mode="json"),
            "warm_start": cfg.warm_start.model_dump(mode="json"),
        },
        "environment": env,
        "accuracy": blob["accuracy"],
        "sft_steps": blob["steps"],
        "sha256": _sha256(weights),
        "bytes": weights.stat().st_size,
    }
    (dest / f"{name}.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return weights


def import_base(key: str, device: torch.device, source: Path) -> str | None:
    """Install the base ``key`` from the folder ``source`` into the warm-start cache.

    Returns what happened, for the log: None when ``source`` has no base of this
    content (it is trained here), else a line. Raises ``BaseMismatch`` when the
    folder's bases of this content were all trained in another environment, or
    when a file does not match its manifest."""
    manifests = sorted(source.glob(f"{key}--*.json"))
    if not manifests:
        return None
    here = _environment_here(device)
    theirs = []
    for path in manifests:
        manifest = json.loads(path.read_text())
        env = manifest.get("environment", {})
        if manifest.get("key") != key or manifest.get("format") != MANIFEST_FORMAT:
            raise BaseMismatch(f"{path}: its manifest is not a base {key} of this version")
        if all(env.get(f) == here.get(f) for f in MATCHED):
            return _install(key, path.with_suffix(".pt"), manifest)
        theirs.append(environment_label(env))
    raise BaseMismatch(
        f"{source} holds base {key} trained on {', '.join(theirs)}, and this machine is "
        f"{environment_label(here)}: the same config trains other bits there, so it is not "
        "this machine's base. Leave out --bases to train it here, or pass bases exported "
        "from a machine of this kind."
    )


def _environment_here(device: torch.device) -> dict[str, Any]:
    # The warm start trains fp32 parameters (trainer.run.warmstart builds the model
    # in the default dtype), so that is the dtype a base trained here would have.
    return base_environment(device, {"p": torch.empty(0, dtype=torch.get_default_dtype())})


def _install(key: str, weights: Path, manifest: dict[str, Any]) -> str:
    if not weights.exists() or _sha256(weights) != manifest["sha256"]:
        raise BaseMismatch(f"{weights}: missing, or its bytes do not match its manifest's SHA-256")
    target = cache_dir() / f"{key}.pt"
    if target.exists():
        return f"base {key}: already in the warm-start cache"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{weights.stem[-8:]}.tmp")
    shutil.copyfile(weights, tmp)
    tmp.replace(target)
    return (
        f"base {key}: imported from {weights.name} (held-out accuracy "
        f"{manifest['accuracy']:.3f} after {manifest['sft_steps']} SFT steps)"
    )


def held_bases(source: Path | None) -> set[str]:
    """The config hashes (``ExperimentConfig.hash("model", "task", "warm_start")``) of
    the bases a folder holds, for a plan (no environment check: the import does it)."""
    if source is None or not source.is_dir():
        return set()
    hashes = set()
    for path in source.glob("*--*.json"):
        content = json.loads(path.read_text()).get("content", {})
        hashes.add(content.get("config_hash", ""))
    return hashes


def expected_key(cfg: ExperimentConfig, device_type: str) -> str:
    """The warm-start key a run of ``cfg`` looks its base up by on a device of this
    type, computed without touching the device (the key reads the device's type
    and, on the CPU, the thread count the run sets: ``run.threads``)."""
    from trainer.tasks import make_task

    vocab = cfg.model.vocab_size or make_task(cfg.task).tokenizer.vocab_size
    threads = torch.get_num_threads()
    if device_type == "cpu" and cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    try:
        return warm_start_key(cfg, vocab, torch.device(device_type))
    finally:
        torch.set_num_threads(threads)
