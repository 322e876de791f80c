"""Survival statistics against hand-computed values (trainer/analysis/kaplan_meier.py)."""

import math

import pytest

from trainer.analysis.kaplan_meier import (
    chi2_1_sf,
    kaplan_meier,
    log_rank,
    median_survival,
    survival_at,
)

TIMES = [3, 5, 5, 8, 10]
EVENTS = [True, True, False, True, False]


def test_kaplan_meier_with_censoring_by_hand():
    curve = kaplan_meier(TIMES, EVENTS)
    assert [(p.time, p.at_risk, p.events) for p in curve] == [(3, 5, 1), (5, 4, 1), (8, 2, 1)]
    # S: 4/5 = .8; .8 x 3/4 = .6; .6 x 1/2 = .3 (the run censored at 5 leaves the risk set)
    assert [p.survival for p in curve] == pytest.approx([0.8, 0.6, 0.3])
    # Greenwood: sums 1/20, + 1/12, + 1/2
    assert curve[0].se == pytest.approx(0.8 * math.sqrt(0.05))
    assert curve[1].se == pytest.approx(0.6 * math.sqrt(0.05 + 1 / 12))
    assert curve[2].se == pytest.approx(0.3 * math.sqrt(0.05 + 1 / 12 + 0.5))
    assert survival_at(curve, 2) == 1.0 and survival_at(curve, 6) == pytest.approx(0.6)


def test_median_and_brookmeyer_crowley_interval_by_hand():
    ci = median_survival(TIMES, EVENTS)
    assert ci.median == 8  # first time S <= .5
    # lower: .8 <= .5 + 1.96 x .1789 = .851 already at t = 3; upper: S never < .5 - 1.96 se
    assert ci.low == 3 and ci.high is None
    nobody = median_survival([100, 100], [False, False])
    assert nobody.median is None and nobody.low is None


def test_log_rank_by_hand():
    # A: collapses at 2 and 4; B: censored at 3, collapses at 5.
    # t=2: n=4 (2+2), d=1: E_A = .5, V = 1 x .5 x .5 x 3/3 = .25
    # t=4: n=2 (1+1), d=1: E_A = .5, V = .25;  t=5: n_A = 0, E_A = 0, V = 0
    # O - E = 2 - 1 = 1, chi2 = 1 / .5 = 2, p = erfc(1) = .1573
    result = log_rank([2, 4], [True, True], [3, 5], [False, True])
    assert (result.observed, result.expected, result.variance) == pytest.approx((2, 1, 0.5))
    assert result.chi2 == pytest.approx(2.0)
    assert result.p_value == pytest.approx(0.157299, abs=1e-6)
    assert log_rank([9], [False], [9], [False]).p_value is None


def test_chi2_1_survival_function():
    assert chi2_1_sf(3.841458820694124) == pytest.approx(0.05, abs=1e-9)
    assert chi2_1_sf(0.0) == 1.0


def test_mean_interval_is_bca_with_t_below_three_values():
    import numpy as np
    from scipy import stats

    from trainer.analysis.intervals import mean_ci

    assert mean_ci([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)
    assert mean_ci([3.0]) == (3.0, 3.0, 3.0)
    assert mean_ci([float("nan"), None]) is None
    # two values: the t interval, mean 0.5 +- t(0.975, 1) * 0.5 = 0.5 +- 6.3531
    mean, lo, hi = mean_ci([0.0, 1.0])
    assert mean == 0.5 and hi - mean == pytest.approx(stats.t.ppf(0.975, 1) * 0.5)
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    mean, lo, hi = mean_ci(values)
    bca = stats.bootstrap((values,), np.mean, n_resamples=9999, method="BCa",
                          random_state=np.random.default_rng(0)).confidence_interval  # fmt: skip
    assert mean == 4.5 and (lo, hi) == pytest.approx((bca.low, bca.high))


def test_kaplan_meier_and_log_rank_equal_lifelines():
    """The hand-written estimators the dashboards use equal the library's."""
    import numpy as np
    from lifelines import KaplanMeierFitter
    from lifelines.statistics import logrank_test

    rng = np.random.default_rng(7)
    a_t = rng.integers(1, 150, 14).tolist()
    a_e = (rng.random(14) < 0.6).tolist()
    b_t = rng.integers(1, 150, 11).tolist()
    b_e = (rng.random(11) < 0.4).tolist()
    curve = kaplan_meier(a_t, a_e)
    km = KaplanMeierFitter().fit(a_t, a_e)
    for point in curve:
        assert point.survival == pytest.approx(km.predict(point.time), abs=1e-12)
    ours = log_rank(a_t, a_e, b_t, b_e)
    theirs = logrank_test(a_t, b_t, event_observed_A=a_e, event_observed_B=b_e)
    assert ours.chi2 == pytest.approx(theirs.test_statistic, rel=1e-10)
    assert ours.p_value == pytest.approx(theirs.p_value, rel=1e-8)
