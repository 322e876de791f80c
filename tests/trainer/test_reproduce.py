"""`trainer reproduce`: a recorded run trained again and compared with its record."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from trainer.cli import main
from trainer.devices.environment import code_record, environment_record
from trainer.errors import FieldError
from trainer.run_folder.files import read_metrics
from trainer.studies.reproduce import (
    code_differences,
    compare_rows,
    machine_differences,
    reproduce,
)


def test_rows_compare_exactly_and_leave_out_the_clock():
    recorded = [
        {"step": 0, "policy/loss": 0.25, "time/step_s": 1.0, "experts/load/L0": [0.5, 0.5]},
        {"step": 1, "policy/loss": float("nan"), "throughput/tokens_per_s": 9.0},
    ]
    same = [
        {"step": 0, "policy/loss": 0.25, "time/step_s": 7.0, "experts/load/L0": [0.5, 0.5]},
        {"step": 1, "policy/loss": float("nan"), "throughput/tokens_per_s": 1.0},
    ]
    result = compare_rows(recorded, same)
    # step 0: step, loss, load; step 1: step, loss (NaN equals NaN); the clock left out
    assert result.identical and result.steps == 2 and result.values == 5
    off = [dict(same[0], **{"policy/loss": math.nextafter(0.25, 1.0)}), same[1]]
    result = compare_rows(recorded, off)
    assert not result.identical
    assert result.differences == [(0, "policy/loss", 0.25, math.nextafter(0.25, 1.0))]
    missing = [{k: v for k, v in same[0].items() if k != "experts/load/L0"}]
    assert compare_rows(recorded, missing).differences == [(0, "experts/load/L0", [0.5, 0.5], None)]


def test_machine_and_code_differences_name_what_differs():
    here = {"cpu": {"model_name": "AMD EPYC", "family": "25", "model": "17",
                    "capability": "AVX512"}, "torch": "2.13.0+cpu",
            "blas": {"library": "mkl"}}  # fmt: skip
    assert machine_differences(here, here) == []
    other = {**here, "cpu": {**here["cpu"], "capability": "AVX2"}}
    assert machine_differences(other, here) == ["cpu.capability: recorded 'AVX2', here 'AVX512'"]
    code = {"commit": "a" * 40, "modified": False, "sha256": "1" * 64}
    assert code_differences({"code": code}, code) == []
    changed = code_differences({"code": code}, {**code, "commit": "b" * 40, "sha256": "2" * 64})
    assert changed and "recorded commit " + "a" * 40 in changed[0]
    assert "not recorded" in code_differences({}, code)[0]


def test_every_run_records_its_code(finished_run):
    _, summary = finished_run
    recorded = summary["environment"]["code"]
    assert recorded == code_record() and len(recorded["sha256"]) == 64
    assert environment_record()["code"] == recorded


@pytest.mark.slow
def test_a_finished_run_reproduces_to_the_bit_and_a_changed_record_does_not(
    finished_run, tmp_path, capsys
):
    run_dir, _ = finished_run
    again = reproduce(run_dir, tmp_path / "again")
    assert again.identical, again.differences[:3]
    assert again.steps == len(read_metrics(run_dir)) and again.machine == []
    # The first 2 steps of the same run, through the CLI.
    assert main([
        "reproduce", str(run_dir), "--out", str(tmp_path / "two"), "--steps", "2"
    ]) == 0  # fmt: skip
    assert "identical: 2 steps" in capsys.readouterr().out
    # A record with one value changed is caught, by step and key.
    edited = tmp_path / "edited"
    shutil.copytree(run_dir, edited, ignore=shutil.ignore_patterns("checkpoints", "*.lock"))
    rows = read_metrics(edited)
    rows[1]["policy/entropy"] += 1e-9
    (edited / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["reproduce", str(edited), "--out", str(tmp_path / "third"), "--steps", "2"]) == 1
    out = capsys.readouterr().out
    assert "different: 1 values differ over 2 steps" in out and "step 1 policy/entropy" in out


def test_refusals_name_the_field(finished_run, tmp_path):
    run_dir, _ = finished_run
    with pytest.raises(FieldError, match="run_dir"):
        reproduce(tmp_path, tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FieldError, match="--out"):
        reproduce(run_dir, tmp_path / "full")
    with pytest.raises(FieldError, match="--steps"):
        reproduce(run_dir, tmp_path / "new", steps=0)
