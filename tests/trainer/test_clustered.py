"""Base-clustered inference (trainer/analysis/clustered.py) against hand-computed values,
statsmodels' own cluster-robust fit, and the audit's re-analysis of the causal study."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainer.analysis.clustered import (
    WEBB,
    crv1_t,
    linear_effect,
    paired_contrast,
    weight_vectors,
    wild_cluster_bootstrap,
)

ROOT = Path(__file__).resolve().parents[2]


def test_webb_weights_have_mean_zero_and_variance_one():
    assert sum(WEBB) == pytest.approx(0.0, abs=1e-12)
    assert sum(w * w for w in WEBB) / 6 == pytest.approx(1.0)
    grid, enumerated = weight_vectors(4)
    assert enumerated and grid.shape == (6**4, 4) and len({tuple(r) for r in grid}) == 1296


def test_wild_cluster_bootstrap_by_hand():
    """Three clusters of one observation each, y = (1, 2, 3), H0: mean 0.

    Intercept-only: beta = 2, residuals (-1, 0, 1), X (X'X)^-1 = 1/3 per row, so the
    CRV1 variance is c * sum((e_g / 3)^2) = 1.5 * 2/9 = 1/3 with c = G/(G-1) (N-1)/(N-K)
    = 3/2 * 2/2, and t = 2 / sqrt(1/3) = 2 sqrt(3). Restricted under H0 the fit is 0 and
    the residuals are y itself; of the 8 Rademacher sign vectors only +-(1, 1, 1) give
    |t*| >= 2 sqrt(3) (e.g. (1, -2, 3): mean 2/3, t* = 0.459), so p = 2/8."""
    frame = pd.DataFrame({"y": [1.0, 2.0, 3.0], "g": [0, 1, 2]})
    out = wild_cluster_bootstrap(frame, "y ~ 1", "Intercept", "g", kind="rademacher")
    assert out["t"] == pytest.approx(2 * math.sqrt(3))
    assert out["p"] == pytest.approx(0.25) and out["draws"] == 8 and out["enumerated"]
    one = crv1_t(np.ones((3, 1)), np.array([[1.0, -2.0, 3.0]]), np.array([0, 1, 2]), 0)[0]
    assert one == pytest.approx((2 / 3) / math.sqrt(1.5 * 114 / 81))


def test_crv1_t_is_statsmodels_cluster_t():
    import statsmodels.formula.api as smf

    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"x": rng.normal(size=40), "g": np.repeat(np.arange(5), 8)})
    frame["y"] = 0.3 * frame["x"] + rng.normal(size=40) + frame["g"] * 0.2
    model = smf.ols("y ~ x + C(g)", data=frame)
    fit = model.fit(cov_type="cluster", cov_kwds={"groups": frame["g"].to_numpy()})
    column = list(model.exog_names).index("x")
    mine = crv1_t(model.exog, model.endog[None, :], frame["g"].to_numpy(), column)[0]
    assert mine == pytest.approx(float(fit.tvalues["x"]), rel=1e-10)


def test_sampled_draws_are_seeded_and_repeatable():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"y": rng.normal(size=70), "g": np.repeat(np.arange(7), 10)})
    first = wild_cluster_bootstrap(frame, "y ~ 1", "Intercept", "g", draws=999, seed=4)
    assert not first["enumerated"] and first["draws"] == 999  # 6^7 > the enumeration cap
    assert first == wild_cluster_bootstrap(frame, "y ~ 1", "Intercept", "g", draws=999, seed=4)


def test_paired_contrast_counts_bases_and_signs():
    out = paired_contrast([0.1, 0.2, -0.05, 0.3, 0.1, 0.2], [0, 0, 1, 1, 2, 2], kind="rademacher")
    assert out["pairs"] == 6 and out["bases"] == 3 and out["bases_positive"] == 3
    assert out["mean"] == pytest.approx(0.85 / 6)
    assert out["wild_cluster"]["draws"] == 8


@pytest.mark.slow
def test_the_audit_s_numbers_from_the_causal_study_s_folders():
    """The audit re-fitted the causal study's slope (held-out change against the
    routing gap, MoE without replay, 48 runs on 4 bases): p = 0.028 by least squares,
    0.053 with base and 0.084 with seed fixed effects, 0.105 cluster-robust by base."""
    from trainer.analysis.causal_report import heldout_change, load_runs
    from trainer.analysis.survival import GAP_UNIT
    from trainer.studies.definition import load_definition

    runs = load_runs(load_definition("causal"), ROOT / "docs/results/causal/runs")
    frame = pd.DataFrame(
        [
            {"seed": r.seed, "base": r.base, "change": heldout_change(r),
             "gap10": r.gap / GAP_UNIT}
            for r in runs
            if r.moe and not r.r3
        ]
    )  # fmt: skip
    effect = linear_effect(frame, "change", "gap10")
    assert effect["runs"] == 48 and effect["bases"] == 4
    assert effect["ols"]["coef"] == pytest.approx(-0.0193, abs=5e-5)
    assert round(effect["ols"]["p"], 3) == 0.028
    assert round(effect["base_fe"]["p"], 3) == 0.053
    assert round(effect["seed_fe"]["p"], 3) == 0.084
    assert round(effect["cluster_base"]["p"], 3) == 0.105
    assert effect["wild_cluster"]["p"] == pytest.approx(296 / 1296)  # every Webb vector
