"""Study statistics: Holm, intervals, the power simulator and the Cox models (lifelines)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainer import metric_keys as K
from trainer.analysis.intervals import bca_interval, holm, t_interval
from trainer.analysis.power import Design, power, simulate_study
from trainer.analysis.run_record import RunRecord, run_gap
from trainer.analysis.survival import (
    GAP_UNIT,
    architecture_model,
    dose_model,
    lead_lag_frame,
    lead_lag_model,
    run_table,
)
from trainer.studies.calibration import balance_of


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.04 -> 3 x 0.01 = 0.03, 2 x 0.02 = 0.04, 1 x 0.04 = 0.04
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    # monotone: a later (larger) p never gets a smaller adjusted value
    # sorted 0.001 x 4, 0.02 x 3, 0.5 x 2 = 1.0, then 0.9 x 1 stays at the running 1.0
    assert holm([0.001, 0.9, 0.02, 0.5]) == pytest.approx([0.004, 1.0, 0.06, 1.0])


def test_t_interval_by_hand():
    # mean 2, sd 1, n 3: t(0.975, 2) = 4.302653 -> 2 +- 4.302653 / sqrt(3)
    low, high = t_interval([1.0, 2.0, 3.0])
    assert low == pytest.approx(2 - 4.302653 / math.sqrt(3), rel=1e-6)
    assert high == pytest.approx(2 + 4.302653 / math.sqrt(3), rel=1e-6)
    assert t_interval([5.0]) is None


def test_bca_interval_covers_the_mean_and_is_degenerate_for_constants():
    rng = np.random.default_rng(1)
    x = rng.normal(10.0, 2.0, size=30)
    low, high = bca_interval(x.tolist(), resamples=2000)
    assert low < x.mean() < high
    assert bca_interval([0.5, 0.5, 0.5]) == (0.5, 0.5)


def test_simulated_event_rate_at_zero_dose_is_p0():
    design = Design(doses=(0.0,), runs_per_cell=20000, bases=4, p0=0.2)
    _, event, _, _ = simulate_study(design, 3.0, np.random.default_rng(0))
    assert event.mean() == pytest.approx(0.2, abs=0.01)


@pytest.mark.slow
def test_power_grows_with_the_hazard_ratio():
    design = Design(doses=(0, 1, 2), runs_per_cell=12, bases=4, p0=0.2)
    null = power(design, 1.0, sims=60, seed=1)
    strong = power(design, 4.0, sims=60, seed=1)
    assert null <= 0.15 and strong >= 0.8


@pytest.mark.slow
def test_power_of_the_cluster_robust_cox_fit():
    """The near-edge study's primary fit: one baseline hazard, errors clustered by base."""
    from trainer.analysis.power import dose_test

    design = Design(doses=(0, 1, 2.5), runs_per_cell=24, bases=8, p0=0.25, horizon=200,
                    model="cluster")  # fmt: skip
    null = power(design, 1.0, sims=60, seed=2)
    strong = power(design, 3.0, sims=60, seed=2)
    assert null <= 0.15 and strong >= 0.8
    time, event, dose, base = simulate_study(design, 2.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="model must be"):
        dose_test(time, event, dose, base, model="frailty")


def _run(variant, seed, base, moe, r3, gap, time, event, steps=150):
    rows = [
        {"step": s, K.MISMATCH_ROUTING_INCONSISTENCY: gap, K.MISMATCH_KL_K3: 1e-3 * (1 + gap)}
        for s in range(steps)
    ]
    return RunRecord(
        variant=variant,
        seed=seed,
        base=base,
        moe=moe,
        r3=r3,
        gap=run_gap(rows),
        collapsed=bool(event),
        collapse_step=time if event else None,
        steps=steps,
        rows=rows,
    )


def test_run_gap_is_the_mean_routing_inconsistency_of_the_first_steps():
    rows = [
        {"step": s, K.MISMATCH_ROUTING_INCONSISTENCY: 0.1 if s < 10 else 0.9} for s in range(20)
    ]
    assert run_gap(rows) == pytest.approx(0.1)
    assert run_gap([{"step": 0}]) == 0.0


def test_dose_model_finds_a_strong_gap_effect_that_r3_removes():
    rng = np.random.default_rng(0)
    runs = []
    for arm, r3 in (("moe", False), ("moe-r3", True)):
        for gap in (0.0, 0.1, 0.2, 0.4):
            for seed in range(12):
                # hazard rises 8x per 10 points of gap without replay; flat with R3
                rate = 0.002 * (8 ** (gap / GAP_UNIT) if not r3 else 1.0)
                t = rng.exponential(1 / rate)
                runs.append(
                    _run(f"{arm}-{gap}", seed, seed % 4, True, r3, gap, math.ceil(t), t < 150)
                )
    frame = run_table(runs)
    assert set(frame["base"]) == {0, 1, 2, 3} and frame["gap10"].max() == pytest.approx(4.0)
    model = dose_model(frame)
    assert model["gap"]["hr"] > 2 and model["gap"]["p"] < 0.01
    assert model["r3_interaction"]["hr"] < 1
    with_r3 = model["gap_with_r3"]
    assert with_r3["hr_low"] < 1.5 and with_r3["hr_low"] < with_r3["hr"] < with_r3["hr_high"]


def test_architecture_model_compares_moe_and_dense_at_zero_gap():
    rng = np.random.default_rng(3)
    runs = []
    for moe in (True, False):
        for seed in range(16):
            t = rng.exponential(1 / (0.01 if moe else 0.001))
            runs.append(_run("x", seed, seed % 4, moe, False, 0.0, math.ceil(t), t < 150))
    model = architecture_model(run_table(runs))
    assert model["moe"]["hr"] > 1 and model["runs"] == 32


def test_lead_lag_frame_is_time_matched_and_lagged():
    run = _run("moe", 0, 0, True, False, 0.2, 8, True, steps=20)
    run.rows[2][K.MISMATCH_KL_K3] = 0.1
    frame = lead_lag_frame([run], lag=5)
    # steps 5..8 at risk (the run ends at its collapse step 8), event on step 8 only
    assert frame["stop"].tolist() == [5, 6, 7, 8]
    assert frame["event"].tolist() == [0, 0, 0, 1]
    # step 7 carries step 2's k3 (lag 5)
    assert frame.loc[frame["stop"] == 7, "log10_k3_lag"].item() == pytest.approx(-1.0)
    assert frame["routing_lag10"].iloc[0] == pytest.approx(2.0)


def test_lead_lag_model_detects_a_signal_that_precedes_collapse():
    rng = np.random.default_rng(5)
    runs = []
    for seed in range(40):
        steps = 150
        spike = int(rng.integers(20, 130)) if seed % 2 == 0 else None
        rows = []
        for s in range(steps):
            k3 = 1e-3 * (100 if spike is not None and s >= spike else 1) * rng.lognormal(0, 0.3)
            rows.append({"step": s, K.MISMATCH_KL_K3: k3, K.MISMATCH_ROUTING_INCONSISTENCY: 0.1})
        end = spike + 8 if spike is not None else None
        runs.append(
            RunRecord(
                variant="moe", seed=seed, base=0, moe=True, r3=False, gap=run_gap(rows),
                collapsed=end is not None, collapse_step=end, steps=steps, rows=rows,
            )
        )  # fmt: skip
    model = lead_lag_model(runs, lag=5)
    assert model["events"] == 20
    assert model["k3_per_decade"]["hr"] > 3 and model["k3_per_decade"]["p"] < 0.01


def test_balance_of_counts_dead_experts_entropy_and_maxvio():
    balanced = balance_of([[0.25] * 4])
    assert balanced["dead_experts"] == 0
    assert balanced["load_entropy"] == pytest.approx(1.0)
    assert balanced["max_violation"] == pytest.approx(0.0)
    skewed = balance_of([[0.5, 0.49, 0.01, 0.0]])
    assert skewed["dead_experts"] == 2  # 0.01 and 0 are under 0.1 x 0.25
    assert skewed["max_violation"] == pytest.approx(1.0)


def test_detector_error_rates_in_the_study_regime():
    from trainer.analysis.detector_error import Regime, false_positive_rate, injected
    from trainer.config import CollapseConfig

    regime, cfg = Regime(steps=120), CollapseConfig()
    assert false_positive_rate(0.3, regime, cfg, runs=15) <= 0.2
    found = injected(0.3, regime, cfg, runs=15, fall_to=0.1, fall_steps=1)
    assert found["found"] >= 0.9 and found["median_delay"] <= 15
    assert abs(found["median_dating_error"]) <= 5


def test_detector_on_real_runs_with_an_injected_collapse():
    """A real-looking run at 0.4 that never falls is not flagged; the same run with
    every correct answer thinned to a fifth from step 60 on is, within a few steps."""
    import numpy as np

    from trainer.analysis.detector_error import RealRun, judge_real, real_runs_error
    from trainer.config import CollapseConfig

    rng = np.random.default_rng(0)
    run = RealRun(
        name="flat/seed0",
        batch=rng.binomial(128, 0.4, 150) / 128,
        evals={s: float(rng.binomial(256, 0.4) / 256) for s in range(0, 150, 10)},
        samples=128, eval_samples=256, cfg=CollapseConfig(),
    )  # fmt: skip
    assert judge_real(run) == (False, None, None)
    keep = np.ones(150)
    keep[60:] = 0.2
    collapsed, known, dated = judge_real(run, keep, np.random.default_rng(1))
    assert collapsed and 60 <= known <= 75 and 55 <= dated <= 70
    summary = real_runs_error([run, run], seed=3)
    assert summary["flagged_as_they_are"] == 0 and summary["injected_found"] == 1.0
    assert summary["median_delay"] <= 15


def test_collapse_rate_bound_is_the_exact_binomial_bound():
    from trainer.analysis.causal_report import collapse_rate_bound, decide

    # 0 events: 1 - 0.05 ** (1 / n) (the "rule of three" is its approximation 3 / n)
    assert collapse_rate_bound(0, 12) == pytest.approx(1 - 0.05 ** (1 / 12))
    assert collapse_rate_bound(0, 36) == pytest.approx(1 - 0.05 ** (1 / 36))
    assert collapse_rate_bound(3, 3) == 1.0 and collapse_rate_bound(0, 0) is None
    # 1 of 10: the rate p with P(X <= 1) = 0.05, i.e. (1-p)^10 + 10 p (1-p)^9 = 0.05
    p = collapse_rate_bound(1, 10)
    assert (1 - p) ** 10 + 10 * p * (1 - p) ** 9 == pytest.approx(0.05)
    pooled = {"runs": 36, "collapsed": 0, "collapse_rate_upper95": collapse_rate_bound(0, 36)}
    assert decide(None, {}, pooled).startswith("no collapse at any routing gap: 0 of 36")


def test_detectable_hazard_ratio_by_hand():
    from trainer.analysis.power import detectable_hazard_ratio

    # (1.959964 + 0.841621)^2 = 7.849; 20 events, sd 1: log HR = 2.801585 / sqrt(20)
    assert detectable_hazard_ratio(20, 1.0) == pytest.approx(math.exp(2.801585 / math.sqrt(20)))
    # twice the spread halves log HR
    assert math.log(detectable_hazard_ratio(20, 2.0)) == pytest.approx(
        math.log(detectable_hazard_ratio(20, 1.0)) / 2
    )
    assert detectable_hazard_ratio(0, 1.0) is None and detectable_hazard_ratio(5, 0.0) is None


def test_paired_contrasts_against_the_reference_cell_by_hand():
    """Per seed: the cell's held-out change minus the reference's on that seed; seeds
    only one cell finished are left out."""
    from trainer import metric_keys as K
    from trainer.analysis.causal_report import paired_contrasts

    def run(variant, seed, first, last):
        rows = [
            {"step": 0, K.EVAL_ACCURACY: first},
            {"step": 1},
            {"step": 2, K.EVAL_ACCURACY: last},
        ]
        return RunRecord(
            variant=variant,
            seed=seed,
            base=0,
            moe=True,
            r3=False,
            gap=0.0,
            collapsed=False,
            collapse_step=None,
            steps=3,
            rows=rows,
        )  # one base

    runs = [run("ref", 0, 0.2, 0.5), run("ref", 1, 0.3, 0.5), run("ref", 2, 0.1, 0.2),
            run("fix", 0, 0.2, 0.4), run("fix", 1, 0.3, 0.6)]  # fmt: skip
    # seed 0: 0.2 - 0.3 = -0.1; seed 1: 0.3 - 0.2 = +0.1; seed 2: no pair
    out = paired_contrasts(runs, "ref")
    assert set(out) == {"fix"} and out["fix"]["pairs"] == 2
    assert out["fix"]["mean"] == pytest.approx(0.0, abs=1e-12)
    low, high = out["fix"]["t"]
    assert low == pytest.approx(-high) and high == pytest.approx(12.706204736 * 0.1, rel=1e-6)
    assert paired_contrasts(runs, None) == {}
