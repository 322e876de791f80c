"""Several runs per GPU: slot plans, the pool's slot claims, the memory share."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import Counter

import pytest
import torch

from trainer.config import ExperimentConfig
from trainer.devices import packing
from trainer.devices.packing import (
    MEMORY_SHARE_ENV,
    Slot,
    apply_memory_share,
    claim_slot,
    memory_share,
    plan_slots,
)


def test_five_processes_over_two_gpus_round_robin_with_even_shares():
    slots = plan_slots(5, 2)
    assert [s.device for s in slots] == ["0", "1", "0", "1", "0"]
    # GPU 0 holds three processes (1/3 each), GPU 1 two (1/2 each)
    assert [s.memory_share for s in slots] == pytest.approx([1 / 3, 1 / 2, 1 / 3, 1 / 2, 1 / 3])
    per_device = Counter(s.device for s in slots)
    for device, count in per_device.items():
        shares = [s.memory_share for s in slots if s.device == device]
        assert sum(shares) == pytest.approx(1.0)  # a GPU is never promised past its memory
        assert count == len(shares)


def test_one_process_per_gpu_keeps_the_whole_device_and_cpu_slots_name_none():
    assert plan_slots(2, 2, ["3", "5"]) == [Slot("3", None), Slot("5", None)]
    assert plan_slots(3, 0) == [Slot(None, None)] * 3
    assert Slot(None, None).environment() == {}
    assert Slot("5", 0.25).environment() == {
        "CUDA_VISIBLE_DEVICES": "5",
        MEMORY_SHARE_ENV: "0.250000",
    }
    with pytest.raises(ValueError, match="device names"):
        plan_slots(2, 2, ["0"])
    with pytest.raises(ValueError, match="processes"):
        plan_slots(0, 1)


def test_the_memory_share_is_read_checked_and_applied_on_cuda_only(monkeypatch):
    monkeypatch.delenv(MEMORY_SHARE_ENV, raising=False)
    assert memory_share() is None
    monkeypatch.setenv(MEMORY_SHARE_ENV, "1.5")
    with pytest.raises(ValueError, match=MEMORY_SHARE_ENV):
        memory_share()
    monkeypatch.setenv(MEMORY_SHARE_ENV, "half")
    with pytest.raises(ValueError, match="not a number"):
        memory_share()
    monkeypatch.setenv(MEMORY_SHARE_ENV, "0.25")
    calls = _torch_checks_the_device(monkeypatch)
    assert apply_memory_share(torch.device("cpu")) is None
    assert calls == []
    assert apply_memory_share(torch.device("cuda", 0)) == 0.25
    assert calls == [(0.25, 0)]


def _torch_checks_the_device(monkeypatch) -> list:
    """Run torch's own ``set_per_process_memory_fraction`` (its argument checks, which
    refuse a device without an index) with only the CUDA runtime calls faked: no
    lazy initialisation, device 0 current, the driver call recorded."""
    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_lazy_init", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch._C, "_cuda_setMemoryFraction", lambda f, d: calls.append((f, d)), raising=False
    )
    return calls


def test_a_bare_cuda_device_fails_torchs_check_and_the_trainer_never_passes_one(monkeypatch):
    """The GPU bug: ``torch.device("cuda")`` (no index) made torch raise "Expected a
    torch.device with a specified index" in every packed run before its first step."""
    from trainer.run.context import resolve_device
    from trainer.studies import study

    calls = _torch_checks_the_device(monkeypatch)
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.set_per_process_memory_fraction(0.5, torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("cuda", "auto"):
        assert resolve_device(name) == torch.device("cuda", 0)
    cfg = ExperimentConfig.model_validate({"run": {"device": "cuda"}})
    assert study._device(cfg).index == 0  # the study's base warm starts
    monkeypatch.setenv(MEMORY_SHARE_ENV, "0.125")
    assert apply_memory_share(resolve_device("cuda")) == 0.125
    assert apply_memory_share(torch.device("cuda")) == 0.125  # indexed on the way in
    assert calls == [(0.125, 0), (0.125, 0)]


def _slot_of_this_process(_: int) -> tuple[int, str | None, str | None]:
    return (
        os.getpid(),
        os.environ.get("CUDA_VISIBLE_DEVICES"),
        os.environ.get(MEMORY_SHARE_ENV),
    )


def test_each_pool_process_holds_one_slot_for_its_life_and_no_two_share_one():
    ctx = mp.get_context("spawn")
    plan = plan_slots(3, 2, ["4", "7"])  # 4: two processes at 1/2, 7: one, whole
    queue = ctx.Queue()
    for slot in plan:
        queue.put(slot)
    with ctx.Pool(3, initializer=claim_slot, initargs=(queue,)) as pool:
        seen = pool.map(_slot_of_this_process, range(12), chunksize=1)
    by_pid: dict[int, set] = {}
    for pid, device, share in seen:
        by_pid.setdefault(pid, set()).add((device, share))
    assert all(len(slots) == 1 for slots in by_pid.values())  # a process never moves
    held = Counter(next(iter(slots)) for slots in by_pid.values())
    offered = Counter(
        (s.environment()["CUDA_VISIBLE_DEVICES"], s.environment().get(MEMORY_SHARE_ENV))
        for s in plan
    )
    assert held - offered == Counter()  # every held slot was offered, none twice


def test_a_study_packs_onto_the_visible_gpus(monkeypatch):
    from trainer.studies import study

    cpu = ExperimentConfig.model_validate({"run": {"device": "cpu"}})
    assert study._study_gpus(cpu) == []
    gpu = ExperimentConfig.model_validate({"run": {"device": "auto"}})
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert study._study_gpus(gpu) == ["3", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert study._study_gpus(gpu) == ["0", "1"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert study._study_gpus(gpu) == []
    assert packing.parse_visible_devices("-1") == []
