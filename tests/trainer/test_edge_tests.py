"""The near-edge study's registered tests and decision rule (trainer/analysis/edge_tests.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from trainer.analysis.edge_tests import decide_edge, edge_tests
from trainer.analysis.survival import GAP_UNIT, cox_effect


def _frame(rng, gap_hr: float, r3_hr: float, runs: int = 24, horizon: int = 200):
    """Cells as the study's: MoE at sigma 0 / 0.12 / 0.3 (gap 0 / 10 / 25 points), R3 at
    0.3, dense; constant hazards, 25% of zero-gap runs collapse by the horizon."""
    h0 = -math.log(0.75) / horizon
    cells = [("moe-s0", 1, 0, 0.0, 0.0), ("moe-gap10", 1, 0, 0.12, 0.10),
             ("moe-gap25", 1, 0, 0.3, 0.25), ("moe-r3-gap25", 1, 1, 0.3, 0.25),
             ("dense", 0, 0, 0.0, 0.0)]  # fmt: skip
    records = []
    for name, moe, r3, sigma, gap in cells:
        for seed in range(runs):
            rate = h0 * gap_hr ** (gap / GAP_UNIT) * (r3_hr if r3 else 1.0)
            t = rng.exponential(1 / rate)
            records.append(
                {"variant": name, "seed": seed, "base": seed % 8, "moe": moe, "r3": r3,
                 "sigma": sigma, "precision": "fp32", "gap10": gap / GAP_UNIT if moe else 0.0,
                 "time": float(min(math.ceil(t), horizon)), "event": int(t < horizon)}
            )  # fmt: skip
    return pd.DataFrame.from_records(records)


def test_a_strong_gap_effect_is_found_and_decided():
    frame = _frame(np.random.default_rng(0), gap_hr=3.0, r3_hr=0.2)
    tests = edge_tests(frame)
    p1, s1 = tests["P1"], tests["S1"]
    assert p1["runs"] == 72 and p1["hr"] > 1.5 and p1["p_holm"] < 0.05
    assert s1["runs"] == 48 and s1["hr"] < 1
    assert tests["S2"]["runs"] == 48  # zero-gap MoE and dense
    # Holm over three: the smallest p times 3, never below the raw p.
    assert min(t["p_holm"] for t in tests.values()) == pytest.approx(
        min(3 * min(t["p"] for t in tests.values()), 1.0)
    )
    controls = int(frame[(frame.variant == "moe-s0")]["event"].sum())
    decision = decide_edge(tests, controls, 24)
    assert decision.startswith("the routing gap raises the collapse hazard")


def test_no_edge_no_conclusion():
    frame = _frame(np.random.default_rng(1), gap_hr=1.0, r3_hr=1.0)
    tests = edge_tests(frame)
    assert decide_edge(tests, 1, 24).startswith("the regime did not reach the edge: 1 of 24")
    assert "below" in decide_edge(tests, 5, 24) or "raises" in decide_edge(tests, 5, 24)


def test_cox_effect_clustered_by_base_matches_lifelines():
    from lifelines import CoxPHFitter

    frame = _frame(np.random.default_rng(2), gap_hr=2.0, r3_hr=1.0)
    sub = frame[(frame.moe == 1) & (frame.r3 == 0)][["time", "event", "gap10", "base"]]
    mine = cox_effect(sub, "gap10", cluster="base")
    fit = CoxPHFitter().fit(sub, "time", "event", cluster_col="base")
    assert mine["coef"] == pytest.approx(fit.params_["gap10"])
    assert mine["se"] == pytest.approx(fit.standard_errors_["gap10"])
    assert mine["hr"] == pytest.approx(math.exp(fit.params_["gap10"]))
