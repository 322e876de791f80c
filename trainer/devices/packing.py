"""Several runs per GPU: slots, each an explicit (device, memory share) pair.

A small run (the study presets: tens of millions of parameters) uses a few GB
of an 80-141 GB GPU; one run at a time leaves the device mostly idle. A slot is
one process's place: ``CUDA_VISIBLE_DEVICES`` names exactly one device (so the
process's ``cuda`` is that device and no other), and ``MOE_LAB_GPU_MEMORY_SHARE``
caps the process at its share of that device's memory through
``torch.cuda.set_per_process_memory_fraction``: a run that outgrows its share
gets an out-of-memory error of its own instead of starving its neighbours.

``plan_slots(processes, gpus)`` spreads processes round-robin over the GPUs
(process i on GPU i mod N), each GPU's share split evenly among its processes.
``trainer study`` gives each process of its pool one slot for the process's
life (``claim_slot`` in the pool's initializer), so two processes never hold
the same slot; the platform's workers take theirs from ``LAB_GPU_SLOTS``
(docs/gpu.md, "Several runs per GPU").

Torch-free at import: the planner runs in processes that must not initialise
CUDA before the slot's ``CUDA_VISIBLE_DEVICES`` is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

MEMORY_SHARE_ENV = "MOE_LAB_GPU_MEMORY_SHARE"


@dataclass(frozen=True)
class Slot:
    """One process's place: ``device`` is its CUDA_VISIBLE_DEVICES (None: CPU, no
    GPU; a platform worker's trainer may see several, comma-separated),
    ``memory_share`` its fraction of that device's memory (None: all of it)."""

    device: str | None
    memory_share: float | None

    def environment(self) -> dict[str, str]:
        """The variables a process of this slot starts with."""
        if self.device is None:
            return {}
        env = {"CUDA_VISIBLE_DEVICES": self.device}
        if self.memory_share is not None:
            env[MEMORY_SHARE_ENV] = f"{self.memory_share:.6f}"
        return env


def plan_slots(processes: int, gpus: int, devices: list[str] | None = None) -> list[Slot]:
    """``processes`` slots over ``gpus`` devices (named ``devices``, default "0".."N-1").

    Process i runs on device i mod N; a device with k processes gives each 1/k of
    its memory (no share when k = 1). Without GPUs every slot is a CPU slot.
    """
    if processes < 1:
        raise ValueError(f"processes must be >= 1, not {processes}")
    if gpus <= 0:
        return [Slot(None, None) for _ in range(processes)]
    names = devices or [str(i) for i in range(gpus)]
    if len(names) != gpus:
        raise ValueError(f"{gpus} GPUs but {len(names)} device names: {names}")
    per_device = [len(range(i, processes, gpus)) for i in range(gpus)]
    return [
        Slot(names[i % gpus], None if per_device[i % gpus] == 1 else 1.0 / per_device[i % gpus])
        for i in range(processes)
    ]


def parse_visible_devices(value: str) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` as a list: ``"0,1, 3"`` -> ["0", "1", "3"]; empty or
    "-1" (CUDA's "none") -> []."""
    devices = [d.strip() for d in value.split(",") if d.strip()]
    return [] if devices in ([], ["-1"]) else devices


def claim_slot(slots: Any) -> None:
    """Pool initializer: take one slot from the queue ``slots`` for this process's
    life and set its environment before anything initialises CUDA."""
    slot: Slot = slots.get()
    os.environ.update(slot.environment())


def memory_share() -> float | None:
    """This process's share of its GPU's memory (``MEMORY_SHARE_ENV``), None for all.
    A value outside (0, 1] is a configuration error, named."""
    raw = os.environ.get(MEMORY_SHARE_ENV)
    if not raw:
        return None
    try:
        share = float(raw)
    except ValueError:
        raise ValueError(f"{MEMORY_SHARE_ENV}={raw!r} is not a number") from None
    if not 0.0 < share <= 1.0:
        raise ValueError(f"{MEMORY_SHARE_ENV}={raw!r} must lie in (0, 1]")
    return share


def apply_memory_share(device: Any) -> float | None:
    """Cap this process at its share of ``device``'s memory (CUDA only); returns the
    share applied, None when the process may use all of it or runs on the CPU.

    torch's per-device calls want an indexed device: ``torch.device("cuda")``
    (no index) makes ``set_per_process_memory_fraction`` raise "Expected a
    torch.device with a specified index", which crashed every packed study on a
    GPU before its first run. ``indexed_device`` gives it one."""
    share = memory_share()
    if share is None or getattr(device, "type", str(device)) != "cuda":
        return None
    import torch

    torch.cuda.set_per_process_memory_fraction(share, indexed_device(device))
    return share


def indexed_device(device: Any):
    """``device`` as a ``torch.device`` with an explicit index on CUDA: ``cuda``
    alone becomes ``cuda:<current device>`` (in a slot, the one device it sees);
    other devices are returned as they are."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or device.index is not None:
        return device
    return torch.device("cuda", torch.cuda.current_device())
