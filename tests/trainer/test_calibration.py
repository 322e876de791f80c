"""Gap calibration (trainer/studies/calibration.py): per engine precision and router noise."""

from __future__ import annotations

import pytest
from test_runner import fast_config

from trainer.studies.calibration import calibrate_base, markdown_table


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.mark.slow
def test_calibration_per_precision_and_sigma():
    cfg = fast_config(extra=['rollout.precision="fp32"', "rollout.prompts_per_step=4"])
    out = calibrate_base(cfg, [0.0, 0.5], batches=1, precisions=("fp32", "bf16"))
    rows = {(r["precision"], r["sigma"]): r for r in out["sigmas"]}
    assert set(rows) == {("fp32", 0.0), ("fp32", 0.5), ("bf16", 0.0), ("bf16", 0.5)}
    # fp32 without noise is the training forward itself: no gap at all.
    assert rows[("fp32", 0.0)]["routing_inconsistency"] == 0.0
    assert rows[("fp32", 0.0)]["kl_k3"] < 1e-9
    # The bf16 engine's rounding is a gap of its own; noise flips routes on top of it.
    assert rows[("bf16", 0.0)]["kl_k3"] > rows[("fp32", 0.0)]["kl_k3"]
    assert rows[("fp32", 0.5)]["routing_inconsistency"] > 0
    table = markdown_table({"0": out})
    assert "| bf16 | 0.5 |" in table and table.count("\n") == 5
