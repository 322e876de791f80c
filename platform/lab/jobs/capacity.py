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

Several runs per GPU: with ``LAB_GPU_SLOT_GB`` set, a GPU is cut into slots of
that much memory (``floor(device memory / LAB_GPU_SLOT_GB)``, the memory from
``LAB_GPU_MEMORY_GB`` or nvidia-smi), and a worker given one GPU takes one
slot: a shared ``flock`` on the device's lock (so no whole-GPU worker can take
it meanwhile) and an exclusive one on ``gpu-<i>.slot-<j>.lock``. Start as many
workers as there are slots; each trains one single-GPU run at a time, its
trainer capped at the slot's share of the device's memory
(``MOE_LAB_GPU_MEMORY_SHARE``, trainer/devices/packing.py). A run larger than a
slot belongs on a queue of whole-GPU workers.

A solo-pool worker trains one run at a time: a 4-GPU worker that claims a
2-GPU run leaves its other two idle. Give multi-GPU runs their own queue
(``gpu-a100x8`` in docker-compose.yml), so single-GPU runs never wait behind
them and a small worker never consumes a big run's wake-up.
"""

from __future__ import annotations

import fcntl
import math
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from django.conf import settings

from trainer.devices.packing import Slot, parse_visible_devices

# device -> the open lock file through which this process holds it
_LEASES: dict[str, IO[str]] = {}
# device -> the slot of it this process holds (LAB_GPU_SLOT_GB)
_SLOTS: dict[str, int] = {}


class DeviceBusy(RuntimeError):
    """A device this worker should own is held by another worker on the host."""


def ranks_per_node(gpus: int, cpu_slots: int) -> int:
    """The most ranks one run may ask of a worker: its GPUs, or its CPU slots."""
    return gpus if gpus else cpu_slots


@dataclass(frozen=True)
class WorkerCapacity:
    """``gpus``: devices this worker owns (0 on a CPU host); ``cpu_slots``: ranks a
    CPU worker may start. ``ranks_per_node`` is what a claim compares ``Run.gpus`` with
    (a rank is one trainer process; ``Run.gpus`` is the ranks a run starts on each node)."""

    gpus: int
    cpu_slots: int
    devices: tuple[str, ...] = ()
    # a slot of a shared GPU: its index, the device's slot count and memory share
    slot: int | None = None
    slots: int = 1
    memory_share: float | None = None

    @property
    def ranks_per_node(self) -> int:
        return ranks_per_node(self.gpus, self.cpu_slots)

    def trainer_environment(self, ranks_per_node: int) -> dict[str, str]:
        """What this worker's trainer child adds to its environment: the devices it
        may see and, in a slot of a shared GPU, its share of the memory."""
        return Slot(self.visible_devices(ranks_per_node), self.memory_share).environment()

    def describe(self) -> str:
        if self.slot is not None:
            return f"GPU {self.devices[0]}, slot {self.slot + 1} of {self.slots}"
        if self.devices:
            return f"GPU {','.join(self.devices)}"
        return f"{self.cpu_slots} CPU slot" + ("s" if self.cpu_slots != 1 else "")

    def visible_devices(self, ranks_per_node: int) -> str | None:
        """CUDA_VISIBLE_DEVICES for a trainer of ``ranks_per_node`` ranks (the first devices
        this worker owns); None on a CPU worker."""
        if not self.devices:
            return None
        return ",".join(self.devices[:ranks_per_node])


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


def gpu_memory_gb(device: str) -> float | None:
    """Total memory of host GPU ``device`` in GB: ``LAB_GPU_MEMORY_GB`` when set (every
    GPU of the host alike), else nvidia-smi's; None when neither tells."""
    if settings.LAB_GPU_MEMORY_GB:
        return float(settings.LAB_GPU_MEMORY_GB)
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=memory.total",
                "--format=csv,noheader,nounits",
                "-i",
                device,
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return float(out.strip().splitlines()[0]) / 1024  # MiB -> GiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def slots_per_gpu(memory_gb: float, slot_gb: float) -> int:
    """How many slots of ``slot_gb`` one GPU of ``memory_gb`` holds (at least 1)."""
    return max(1, math.floor(memory_gb / slot_gb + 1e-9))


def _try_flock(path: Path, mode: int) -> IO[str] | None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 (held for the process's life)
    try:
        fcntl.flock(handle, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def lease_slot(device: str, slots: int, lock_dir: Path) -> int | None:
    """Hold a slot of ``device`` for this process: a shared lock on the device (a
    whole-GPU worker holds it exclusively) and the first free slot's exclusive
    lock. Returns the slot index, or None when the device is whole-leased or
    every slot is taken."""
    if device in _SLOTS:
        return _SLOTS[device]
    shared = _try_flock(lock_dir / f"gpu-{device}.lock", fcntl.LOCK_SH)
    if shared is None:
        return None
    for slot in range(slots):
        handle = _try_flock(lock_dir / f"gpu-{device}.slot-{slot}.lock", fcntl.LOCK_EX)
        if handle is not None:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} on {os.uname().nodename}")
            handle.flush()
            _LEASES[device] = shared
            _LEASES[f"{device}.slot-{slot}"] = handle
            _SLOTS[device] = slot
            return slot
    shared.close()
    return None


def _slot_worker(named: tuple[str, ...], gpus: int, slot_gb: float) -> WorkerCapacity:
    """A worker in one slot of a shared GPU: the named device, else the first host
    GPU with a free slot."""
    if gpus != 1:
        raise DeviceBusy(
            f"LAB_GPU_SLOT_GB={slot_gb:g} gives a worker one slot of one GPU; set "
            f"LAB_WORKER_GPUS=1 (not {gpus}) and start one worker per slot"
        )
    lock_dir = Path(settings.LAB_DEVICE_LOCK_DIR)
    candidates = named[:1] or tuple(str(i) for i in range(max(host_gpu_count(), 1)))
    for device in candidates:
        memory = gpu_memory_gb(device)
        if memory is None:
            raise DeviceBusy(
                f"LAB_GPU_SLOT_GB is set but GPU {device}'s memory is unknown: install "
                "nvidia-smi or set LAB_GPU_MEMORY_GB"
            )
        slots = slots_per_gpu(memory, slot_gb)
        slot = lease_slot(device, slots, lock_dir)
        if slot is not None:
            share = min(1.0, slot_gb / memory) if slots > 1 else None
            return WorkerCapacity(
                gpus=1,
                cpu_slots=settings.LAB_WORKER_CPU_SLOTS,
                devices=(device,),
                slot=slot,
                slots=slots,
                memory_share=share,
            )
    raise DeviceBusy(
        f"every slot of GPU {', '.join(candidates)} is taken (or a whole-GPU worker holds "
        "it); start fewer workers or raise the host's GPUs"
    )


def this_worker() -> WorkerCapacity:
    """The capacity of the worker process calling this (from its environment and
    settings), its GPUs leased (``lease_devices``)."""
    devices = tuple(parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES", "")))
    gpus = settings.LAB_WORKER_GPUS if settings.LAB_WORKER_GPUS is not None else len(devices)
    if devices and gpus < len(devices):
        devices = devices[:gpus]
    if gpus and settings.LAB_GPU_SLOT_GB:
        return _slot_worker(devices, gpus, float(settings.LAB_GPU_SLOT_GB))
    if gpus:
        # Owning GPUs but naming none: CUDA numbers the host's devices 0..n-1, and
        # this worker takes the first free ones.
        devices = lease_devices(devices, gpus, host_gpu_count(), Path(settings.LAB_DEVICE_LOCK_DIR))
    return WorkerCapacity(gpus=gpus, cpu_slots=settings.LAB_WORKER_CPU_SLOTS, devices=devices)
