"""bench/device_check.py in its dry mode (what CI can run): every check runs its code
path at a tiny shape on the CPU or says why it skipped, none fails, and the report
says on its face that it measured no device."""

from __future__ import annotations

import json

import pytest

from bench.device_check import CHECKS, main

pytestmark = pytest.mark.slow


def test_the_dry_device_check_runs_every_check_or_says_why_not(tmp_path):
    report = main(["--dry", "--out", str(tmp_path), "--budget-s", "300"])
    assert report["dry"] and set(report["checks"]) == set(CHECKS)
    for name, result in report["checks"].items():
        assert result["status"] in ("ran", "skipped"), (name, result)
        if result["status"] == "skipped":
            assert result["reason"], name
    checks = report["checks"]
    assert {checks[n]["status"] for n in ("numerics", "gpu_tests")} == {"skipped"}
    assert checks["same_seed"]["max_abs_metric_diff"] == {"deterministic=false": 0.0}
    assert checks["collectives"]["backend"] == "gloo" and checks["collectives"]["ranks"] == 2
    assert checks["moe_layer"]["backend"] in ("grouped_mm", "padded", "loop")
    assert checks["rollout"]["engine_tokens_per_s"] > 0
    saved = json.loads((tmp_path / "device_check.json").read_text())
    assert saved["checks"].keys() == report["checks"].keys()
    summary = (tmp_path / "device_check.md").read_text()
    assert "Dry run (no GPU)" in summary and "| numerics | skipped |" in summary
