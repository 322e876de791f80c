"""The stability review's survival statistics and dose layout (no database)."""

import math

import pytest

from dashboard.charts.figures.collapse import dose_response
from dashboard.charts.stability import RunStats, stability_table_rows
from dashboard.charts.stability_stats import dose_layout, split_dose_name, survival_rows
from dashboard.charts.survival import RunOutcome


def run(variant, step, collapsed, kl=0.002, seed=0):
    return RunStats(RunOutcome(variant, step, collapsed, seed), kl, math.nan, 0.0, 0.2)


def test_survival_rows_log_rank_against_moe_grpo_by_hand():
    rows = stability_table_rows(
        [
            # the log-rank example of tests/trainer/test_survival_stats.py: p = erfc(1)
            run("dense-grpo", 2, True, seed=0),
            run("dense-grpo", 4, True, seed=1),
            run("moe-grpo", 3, False, seed=0),
            run("moe-grpo", 5, True, seed=1),
        ]
    )
    dense, moe = survival_rows(rows)
    assert dense.variant == "dense-grpo" and dense.logrank_p == "0.157"
    assert moe.logrank_p == "-"  # the reference itself
    # dense: S = .5 at 2 (se .354: .5 - 1.96 se < 0, so no upper end there), 0 at 4
    assert dense.collapsed == "2/2" and dense.median == "2 [2, 4]"
    assert moe.median == "5 [5, 5]"  # one run at risk at 5: S drops to 0 with se 0
    assert dense.kl_ci == "2.000 [2.000, 2.000] (t, n = 2)"  # shown x1e-3


def test_a_kl_interval_says_what_it_rests_on_and_stops_at_zero():
    """Two seeds far apart: the t interval (one degree of freedom) reaches below 0,
    where no mean KL can lie: it is cut at 0 and says t, n = 2. One seed: no interval."""
    from dashboard.charts.stability_stats import KL_BOUNDS, _ci_label

    two = _ci_label([1e-3, 20e-3], 1e3, 3, KL_BOUNDS)
    assert two == "10.500 [0.000, 131.209] (t, n = 2)"  # 10.5 + 12.70620 x 9.5 (sem)
    assert _ci_label([2e-3], 1e3, 3, KL_BOUNDS) == "2.000 (1 seed: no interval)"


def test_dose_layout_from_variant_names():
    assert split_dose_name("moe-grpo-r3-fp8") == ("moe-grpo-r3", "fp8")
    assert split_dose_name("moe-grpo") is None
    layout = dose_layout(["moe-grpo-fp32", "moe-grpo-fp8", "dense-grpo-fp8", "moe-grpo"])
    assert layout == {
        "levels": ["fp32", "fp8"],
        "arms": {
            "moe-grpo": {"fp32": "moe-grpo-fp32", "fp8": "moe-grpo-fp8"},
            "dense-grpo": {"fp8": "dense-grpo-fp8"},
        },
    }
    assert dose_layout(["moe-grpo-fp8", "moe-grpo-r3-fp8"]) is None  # one level: no axis


def test_dose_response_figure_shares():
    outcomes = {
        "moe-grpo-fp32": [RunOutcome("moe-grpo-fp32", 150, False, 0)],
        "moe-grpo-fp8": [RunOutcome("moe-grpo-fp8", 90, True, 0),
                         RunOutcome("moe-grpo-fp8", 150, False, 1)],
    }  # fmt: skip
    fig = dose_response(outcomes, dose_layout(list(outcomes)))
    (trace,) = fig.data
    assert list(trace.x) == [0, 1] and list(trace.y) == [0.0, 0.5]
    assert list(fig.layout.xaxis.ticktext) == ["fp32", "fp8"]
    assert list(trace.text) == ["fp32: 0/1", "fp8: 1/2"]


def test_arms_with_equal_shares_do_not_hide_each_other():
    """Three arms, none collapsed at either level: three distinct points per level,
    each with its own symbol, the arms centred on the level's tick."""
    outcomes = {
        f"{arm}-{level}": [RunOutcome(f"{arm}-{level}", 150, False, 0)]
        for arm in ("moe-grpo", "moe-grpo-r3", "dense-grpo")
        for level in ("fp32", "fp8")
    }
    fig = dose_response(outcomes, dose_layout(list(outcomes)))
    assert len(fig.data) == 3
    points = {(x, y) for trace in fig.data for x, y in zip(trace.x, trace.y, strict=True)}
    assert len(points) == 6
    assert len({trace.marker.symbol for trace in fig.data}) == 3
    assert sum(trace.x[0] for trace in fig.data) == pytest.approx(0.0)
