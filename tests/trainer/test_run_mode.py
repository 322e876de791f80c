"""run.deterministic and run.tf32 (trainer.devices.run_mode): applied for the run,
restored after it, TF32 refused when not asked for, and recorded in summary.json."""

from __future__ import annotations

import json
import os

import pytest
import torch

from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.devices.run_mode import (
    CUBLAS_WORKSPACE_ENV,
    NumericsModeError,
    check_tf32_off,
    numerics_mode,
)
from trainer.run.device_record import device_record
from trainer.run.runner import train
from trainer.validation import validate_config

FAST = [
    "run.steps=2",
    "run.eval_every=2",
    "run.checkpoint_every=2",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "algorithm.minibatches=2",
    "warm_start.max_steps=20",
    "warm_start.eval_every=20",
    "warm_start.eval_size=8",
    "task.eval_size=8",
    "run.threads=1",
]


def _cfg(*extra: str):
    return validate_config(apply_overrides(preset_dict("moe-grpo"), FAST + list(extra)))


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV, raising=False)


def test_deterministic_mode_is_applied_inside_and_restored_after():
    assert not torch.are_deterministic_algorithms_enabled()
    with numerics_mode(_cfg("run.deterministic=true"), torch.device("cpu")):
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ[CUBLAS_WORKSPACE_ENV] == ":4096:8"
        assert not torch.backends.cudnn.benchmark
    assert not torch.are_deterministic_algorithms_enabled()
    assert CUBLAS_WORKSPACE_ENV not in os.environ


def test_a_foreign_cublas_workspace_is_refused(monkeypatch):
    monkeypatch.setenv(CUBLAS_WORKSPACE_ENV, ":0:0")
    with (
        pytest.raises(NumericsModeError, match="CUBLAS_WORKSPACE_CONFIG"),
        numerics_mode(_cfg("run.deterministic=true"), torch.device("cpu")),
    ):
        pass
    assert not torch.are_deterministic_algorithms_enabled()


def test_tf32_is_off_unless_asked_and_the_check_names_the_field():
    previous = torch.get_float32_matmul_precision()
    try:
        with numerics_mode(_cfg(), torch.device("cpu")):
            check_tf32_off()
            torch.set_float32_matmul_precision("high")  # what a library might do
            with pytest.raises(NumericsModeError, match=r"run\.tf32"):
                check_tf32_off()
        with numerics_mode(_cfg("run.tf32=true"), torch.device("cpu")):
            assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.set_float32_matmul_precision(previous)
    assert not torch.backends.cuda.matmul.allow_tf32


def test_device_record_names_backends_and_fp8_mode():
    record = device_record(_cfg("rollout.precision=fp8"), torch.device("cpu"), torch.float32)
    assert record["capability"] == "cpu"
    assert record["moe_backend"] == {"train": "grouped_mm", "rollout": "grouped_mm"}
    assert record["fp8_rollout"] == "emulated" and record["fp8_gemm_available"] is False
    assert record["fp8_gemms"]["projections"] == record["fp8_gemms"]["experts"] == "emulated"
    dense = validate_config(apply_overrides(preset_dict("dense-grpo"), FAST))
    assert "moe_backend" not in device_record(dense, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize(
    "capability,mode,gemms,rollout_backend",
    [
        ((8, 0), "emulated", ("emulated", "emulated"), "padded"),  # A100
        ((8, 9), "native-dense+emulated-experts", ("native", "emulated"), "padded"),  # L40
        ((9, 0), "native", ("native", "native"), "scaled_grouped_mm"),  # H100 / H200
    ],
)
def test_device_record_says_which_fp8_gemms_are_native(
    monkeypatch, capability, mode, gemms, rollout_backend
):
    """Faked device properties: the record makes the engine's choice from the capability."""
    monkeypatch.setattr("trainer.run.device_record.device_capability", lambda device: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "faked")
    record = device_record(_cfg("rollout.precision=fp8"), torch.device("cuda"), torch.bfloat16)
    assert record["capability"] == f"sm{capability[0]}{capability[1]}"
    assert record["fp8_rollout"] == mode
    assert record["fp8_gemms"] == {
        "projections": gemms[0],
        "experts": gemms[1],
        "router": "bf16",
        "lm_head": "bf16",
    }
    assert record["fp8_gemm_available"] is (capability >= (8, 9))
    assert record["moe_backend"]["rollout"] == rollout_backend
    dense = validate_config(
        apply_overrides(preset_dict("dense-grpo"), [*FAST, "rollout.precision=fp8"])
    )
    dense_mode = device_record(dense, torch.device("cuda"), torch.bfloat16)["fp8_rollout"]
    assert dense_mode == ("emulated" if capability < (8, 9) else "native")


@pytest.mark.slow
def test_a_deterministic_run_records_its_mode_and_repeats_itself(tmp_path):
    """On the CPU every kernel the trainer uses has a deterministic implementation
    (no op raises), and two runs give the same metrics."""
    cfg = _cfg("run.deterministic=true")
    first = train(cfg, tmp_path / "a")
    second = train(cfg, tmp_path / "b")
    assert first["status"] == second["status"] == "succeeded"
    assert first["device"]["deterministic"] is True
    assert first["device"]["moe_backend"]["train"] == "grouped_mm"
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["device"] == first["device"]

    def comparable(run):
        rows = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").open()]
        return [
            {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in rows
        ]

    assert comparable("a") == comparable("b")
    assert not torch.are_deterministic_algorithms_enabled()
