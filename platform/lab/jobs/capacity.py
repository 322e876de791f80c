"""What a worker can run: the GPUs it owns, or CPU slots on a host without GPUs.

A run asks for ``run.gpus`` ranks on one node (``Run.gpus``); a worker claims
it only when it owns that many (``claim_next``). A GPU worker owns the
devices in its ``CUDA_VISIBLE_DEVICES`` (or ``LAB_WORKER_GPUS`` when set); a
worker without GPUs owns ``LAB_WORKER_CPU_SLOTS`` CPU slots, each one gloo
rank on one thread, so multi-rank runs are testable on a laptop.

Two workers on one host never share a GPU: a worker leases each device it
owns with an exclusive ``flock`` on ``LAB_DEVICE_LOCK_DIR/gpu-<i>.lock`` (held
for the life of the process, so even ``kill -9`` releases it). A worker
given ``LAB_WORKER_GPUS=N`` and no ``CUDA_VISIBLE_DEVICES`` takes the first N
devices of the host no other worker holds; a worker that names a device
another holds refuses to start, naming the device and the holder.

A solo-pool worker trains one run at a time: a 4-GPU worker that claims a
2-GPU run leaves its other two idle. Give multi-GPU runs their own queue
(``gpu-a100x8`` in docker-compose.yml), so single-GPU runs never wait behind
them and a small worker never consumes a big run's wake-up.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from django.conf import settings

# device -> the open lock file through which this process holds it
_LEASES: dict[str, IO[str]] = {}


class DeviceBusy(RuntimeError):
    """A device this worker should own is held by another worker on the host."""


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


def host_gpu_count() -> int:
    """NVIDIA GPUs on this host, from the driver's /proc entries (no CUDA init)."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def _try_lease(device: str, lock_dir: Path) -> str | None:
    """Hold ``device`` for this process; None when held now, else who holds it."""
    if device in _LEASES:
        return None
    lock_dir.mkdir(parents=True, exist_ok=True)
    handle = open(lock_dir / f"gpu-{device}.lock", "a+")  # noqa: SIM115 (held for life)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        return holder
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {os.uname().nodename}")
    handle.flush()
    _LEASES[device] = handle
    return None


def lease_devices(
    named: tuple[str, ...], wanted: int, total: int, lock_dir: Path
) -> tuple[str, ...]:
    """The devices this worker owns, leased: ``named`` ones (DeviceBusy if another
    worker holds one), else the first ``wanted`` of the host's ``total`` that no
    other worker holds (DeviceBusy when fewer are free)."""
    if named:
        for device in named:
            holder = _try_lease(device, lock_dir)
            if holder is not None:
                raise DeviceBusy(
                    f"GPU {device} is held by another worker on this host ({holder}); give each "
                    "worker its own devices with CUDA_VISIBLE_DEVICES"
                )
        return named
    taken: list[str] = []
    for index in range(max(total, wanted)):
        if len(taken) == wanted:
            break
        if _try_lease(str(index), lock_dir) is None:
            taken.append(str(index))
    if len(taken) < wanted:
        for device in taken:  # all or nothing
            _LEASES.pop(device).close()
        raise DeviceBusy(
            f"LAB_WORKER_GPUS={wanted}, but only {len(taken)} of the host's {total} GPUs are "
            "free (other workers hold the rest)"
        )
    return tuple(taken)


def this_worker() -> WorkerCapacity:
    """The capacity of the worker process calling this (from its environment and
    settings), its GPUs leased (``lease_devices``)."""
    devices = parse_devices(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    gpus = settings.LAB_WORKER_GPUS if settings.LAB_WORKER_GPUS is not None else len(devices)
    if devices and gpus < len(devices):
        devices = devices[:gpus]
    if gpus:
        # Owning GPUs but naming none: CUDA numbers the host's devices 0..n-1, and
        # this worker takes the first free ones.
        devices = lease_devices(devices, gpus, host_gpu_count(), Path(settings.LAB_DEVICE_LOCK_DIR))
    return WorkerCapacity(gpus=gpus, cpu_slots=settings.LAB_WORKER_CPU_SLOTS, devices=devices)
