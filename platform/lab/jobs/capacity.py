"""What a worker can run: the GPUs it owns, or CPU slots on a host without GPUs.

A run asks for ``run.gpus`` ranks on one node (``Run.gpus``); a worker claims
it only when it owns that many (``claim_next``). A GPU worker owns the
devices in its ``CUDA_VISIBLE_DEVICES`` (or ``LAB_WORKER_GPUS`` when set); a
worker without GPUs owns ``LAB_WORKER_CPU_SLOTS`` CPU slots, each one gloo
rank on one thread, so multi-rank runs are testable on a laptop.

A solo-pool worker trains one run at a time: a 4-GPU worker that claims a
2-GPU run leaves its other two idle. Give multi-GPU runs their own queue
(``gpu-a100x8`` in docker-compose.yml), so single-GPU runs never wait behind
them and a small worker never consumes a big run's wake-up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from django.conf import settings


def usable_ranks(gpus: int, cpu_slots: int) -> int:
    """The most ranks one run may ask of a worker: its GPUs, or its CPU slots."""
    return gpus if gpus else cpu_slots


@dataclass(frozen=True)
class WorkerCapacity:
    """``gpus``: devices this worker owns (0 on a CPU host); ``cpu_slots``: ranks a
    CPU worker may start. ``ranks`` is what a claim compares ``Run.gpus`` with."""

    gpus: int
    cpu_slots: int
    devices: tuple[str, ...] = ()

    @property
    def ranks(self) -> int:
        return usable_ranks(self.gpus, self.cpu_slots)

    def visible_devices(self, ranks: int) -> str | None:
        """CUDA_VISIBLE_DEVICES for a trainer of ``ranks`` ranks (the first devices
        this worker owns); None on a CPU worker."""
        if not self.devices:
            return None
        return ",".join(self.devices[:ranks])


def parse_devices(value: str) -> tuple[str, ...]:
    """``"0,1, 3"`` -> ("0", "1", "3"); empty or "-1" (CUDA's "none") -> ()."""
    devices = tuple(d.strip() for d in value.split(",") if d.strip())
    return () if devices in ((), ("-1",)) else devices


def this_worker() -> WorkerCapacity:
    """The capacity of the worker process calling this (from its environment and settings)."""
    devices = parse_devices(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    gpus = settings.LAB_WORKER_GPUS if settings.LAB_WORKER_GPUS is not None else len(devices)
    if devices and gpus < len(devices):
        devices = devices[:gpus]
    elif gpus and not devices:  # owns GPUs but names none: CUDA numbers them 0..n-1
        devices = tuple(str(i) for i in range(gpus))
    return WorkerCapacity(gpus=gpus, cpu_slots=settings.LAB_WORKER_CPU_SLOTS, devices=devices)
