"""Several runs per GPU through the real queue: two workers share one GPU in
slots of its memory, a third finds no slot, and the two train at the same time.

The host has no GPU: ``LAB_GPU_MEMORY_GB`` stands in for nvidia-smi and the runs
train on the CPU (``run.device=cpu``), so what is tested is the placement (the
leases, the claims, the trainer's environment), not CUDA memory.
"""

from __future__ import annotations

import pytest
from lab_processes import ONE_BROKER, TINY_OVERRIDES

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]


@ONE_BROKER
def test_two_slot_workers_share_a_gpu_and_train_at_once(lab_stack, tmp_path):
    lab_stack.env.update(
        {
            "LAB_WORKER_GPUS": "1",
            "LAB_GPU_SLOT_GB": "40",
            "LAB_GPU_MEMORY_GB": "80",  # two slots
            "LAB_DEVICE_LOCK_DIR": str(tmp_path / "gpu-locks"),
            "CUDA_VISIBLE_DEVICES": "",
        }
    )
    exp = lab_stack.post("/api/experiments", {"name": "slots", "preset": "moe-grpo"})
    overrides = {**TINY_OVERRIDES, "run.device": "cpu", "run.steps": 6}
    body = {"experiment": exp["id"], "preset": "moe-grpo", "overrides": overrides,
            "queue": lab_stack.queue}  # fmt: skip
    runs = [lab_stack.post("/api/runs", body) for _ in range(2)]
    for name in ("w1", "w2"):
        lab_stack.start_worker(name)
        lab_stack.wait_for(lambda n=name: "worker owns" in lab_stack.log(n), 120, f"{name} ready")
    slots = {lab_stack.log(n).split("worker owns ", 1)[1].splitlines()[0] for n in ("w1", "w2")}
    assert slots == {"GPU 0, slot 1 of 2", "GPU 0, slot 2 of 2"}
    third = lab_stack.start_worker("w3")
    lab_stack.wait_for(lambda: third.poll() is not None, 120, "the third worker to give up")
    assert "every slot of GPU 0 is taken" in lab_stack.log("w3")
    lab_stack.procs.pop("w3")  # it was meant to exit: not a death the waits below report

    done = [lab_stack.wait_status(r["id"], {"succeeded"}, timeout=400) for r in runs]
    assert {d["worker_host"] for d in done} == {"w1@e2e", "w2@e2e"}  # one run per slot
    first, second = sorted(done, key=lambda d: d["started_at"])
    assert second["started_at"] < first["finished_at"]  # they trained at the same time
    assert [d["gpu_index"] for d in done] == ["0", "0"]  # both on the one GPU
