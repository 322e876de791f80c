import math

import pytest

from dashboard.charts.figures import STABILITY_COLUMNS, stability_table_rows
from dashboard.charts.stability import RunStats, series_mean
from dashboard.charts.survival import RunOutcome
from trainer import metric_keys as mk


def run(variant, step, collapsed, kl, routing, extreme, accuracy, seed=0):
    return RunStats(RunOutcome(variant, step, collapsed, seed), kl, routing, extreme, accuracy)


def test_rows_by_hand():
    runs = [
        # variant A: two seeds, one censored at 2000
        run("moe-grpo", 600, True, 0.002, 0.10, 0.004, 0.20, seed=0),
        run("moe-grpo", 2000, False, 0.004, 0.14, 0.006, 0.60, seed=1),
        # variant B: every seed collapsed
        run("dense-grpo", 900, True, 0.001, math.nan, 0.001, 0.50, seed=0),
        run("dense-grpo", 1101, True, 0.001, math.nan, 0.003, 0.70, seed=1),
    ]
    a, b = stability_table_rows(runs)
    assert (a.variant, a.runs, b.variant) == ("moe-grpo", 2, "dense-grpo")
    assert a.kl_k3_x1e3 == pytest.approx(3.0)  # mean of 2e-3 and 4e-3, shown x1e-3
    assert a.kl_k3_x1e3_std == pytest.approx(math.sqrt(2))  # sample std of {2, 4}
    assert a.routing_inconsistency_pct == pytest.approx(12.0)
    assert a.extreme_token_pct == pytest.approx(0.5)
    assert a.final_accuracy_pct == pytest.approx(40.0)
    cells = a.cells()
    assert cells["kl_k3_x1e3"] == "3.00 ± 1.41"
    assert cells["routing_inconsistency_pct"] == "12.00%"
    assert cells["collapse_step"] == ">= 1300"  # censored seed: a lower bound, not 1300
    assert cells["collapsed"] == "1/2"
    assert cells["final_accuracy_pct"] == "40.0 ± 28.3%"
    b_cells = b.cells()
    assert b_cells["collapse_step"] == "1001"  # all collapsed: plain mean 1000.5, half up
    assert b_cells["routing_inconsistency_pct"] == "-"  # dense model: not measured
    assert b_cells["kl_k3_x1e3"] == "1.00"  # no spread, no "± 0.00"
    assert set(cells) == {field for field, _ in STABILITY_COLUMNS}


def test_row_as_dict_is_json_ready():
    (row,) = stability_table_rows([run("d", 10, True, 0.001, math.nan, 0.0, 0.5)])
    data = row.as_dict()
    assert data["routing_inconsistency_pct"] is None
    assert data["collapse_step"] == "10" and data["collapse_step_is_lower_bound"] is False
    assert data["kl_k3_x1e3"] == pytest.approx(1.0)


def test_run_stats_from_series():
    steps = [1, 2, 3, 4]
    series = {
        mk.MISMATCH_KL_K3: (steps, [0.001, 0.003, None, 0.1]),
        mk.MISMATCH_ROUTING_INCONSISTENCY: (steps, [0.1, 0.2, 0.3, 0.4]),
        mk.MISMATCH_EXTREME_TOKEN_FRAC: (steps, [0.0, 0.0, 0.0, 0.04]),
        mk.EVAL_ACCURACY: ([2, 4], [0.5, 0.25]),
    }
    outcome = RunOutcome("v", 2, True)
    stats = RunStats.from_series(outcome, series)
    assert stats.kl_k3 == pytest.approx((0.001 + 0.003 + 0.1) / 3)  # gaps left out
    assert stats.final_accuracy == 0.25  # last held-out accuracy logged
    healthy = RunStats.from_series(outcome, series, until_collapse=True, final_accuracy=0.4)
    assert healthy.kl_k3 == pytest.approx(0.002)  # steps 1..2 only
    assert healthy.routing_inconsistency == pytest.approx(0.15)
    assert healthy.final_accuracy == 0.4  # the summary's value wins
    dense = RunStats.from_series(RunOutcome("d", 4, False), {})
    assert math.isnan(dense.kl_k3) and math.isnan(dense.final_accuracy)
    assert math.isnan(series_mean(([1], [None])))


def test_the_kl_column_shows_k3_else_k1_else_the_frameworks_mismatch_labelled():
    outcome = RunOutcome("v", 10, False, 0)

    def stats(**series):
        return RunStats.from_series(outcome, {k: ([0, 1], v) for k, v in series.items()})

    k3 = stats(**{mk.MISMATCH_KL_K3: [0.002, 0.004], mk.MISMATCH_KL_K1: [1.0, 1.0]})
    assert (k3.kl_kind, k3.kl_k3) == (mk.MISMATCH_KL_K3, pytest.approx(0.003))
    k1 = stats(**{mk.MISMATCH_KL_K1: [0.001, 0.003]})
    assert k1.kl_kind == mk.MISMATCH_KL_K1
    (row,) = stability_table_rows([k1])
    assert row.cells()["kl_k3_x1e3"] == "2.00 (k1)"
    assert row.as_dict()["kl_kind"] == mk.MISMATCH_KL_K1
    logp = stats(**{mk.MISMATCH_LOGP_ABS_DIFF: [0.01, 0.01]})
    assert stability_table_rows([logp])[0].cells()["kl_k3_x1e3"] == "10.00 (|Δlog p|)"
    prob = stats(**{mk.MISMATCH_PROB_ABS_DIFF: [0.005, 0.005]})
    assert stability_table_rows([prob])[0].cells()["kl_k3_x1e3"] == "5.00 (|Δp|)"
    # seeds of one variant with k3 and with k1 only: the k3 seeds' mean
    (mixed,) = stability_table_rows([k3, k1])
    assert mixed.kl_kind == mk.MISMATCH_KL_K3 and mixed.kl_k3_x1e3 == pytest.approx(3.0)
    assert stability_table_rows([stats()])[0].cells()["kl_k3_x1e3"] == "-"
