"""Lead-lag definitions on constructed series (trainer/analysis/lead_lag.py)."""

from trainer.analysis.lead_lag import lead_lag_table, rise_step


def test_rise_step_by_hand():
    # baseline median of steps 0-9 = 1; level 5 from step 20: the 5-step median passes 3 at
    # step 22 (3 of 5 high), stays for 22, 23, 24 -> rise dated 22 - 2 = 20
    values = [1.0] * 20 + [5.0] * 20
    assert rise_step(list(range(40)), values) == 20


def test_a_short_spike_is_not_a_rise():
    values = [1.0] * 20 + [50.0, 50.0] + [1.0] * 20  # two steps: the 5-step median never moves
    assert rise_step(list(range(42)), values) is None


def test_none_and_zero_baseline():
    assert rise_step(list(range(5)), [1.0] * 5) is None  # too short for a baseline
    assert rise_step(list(range(30)), [0.0] * 30) is None


def test_lead_lag_table_with_a_control():
    def rows(level_from):
        return [{"step": s, "k3": 1.0 if s < level_from else 10.0} for s in range(60)]

    runs = [
        {"rows": rows(20), "collapsed": True, "collapse_step": 30},  # rose 10 steps before
        {"rows": rows(40), "collapsed": True, "collapse_step": 35},  # rose 5 steps after
        {"rows": rows(100), "collapsed": True, "collapse_step": 30},  # never rose
        {"rows": rows(25), "collapsed": False, "collapse_step": None},  # control that rose
    ]
    (row,) = lead_lag_table(runs, ["k3"])
    assert (row.collapsed_runs, row.rose, row.rose_before) == (3, 2, 1)
    assert row.leads == [10, -5] and row.median_lead == 2.5
    assert (row.control_runs, row.control_rose) == (1, 1)


def test_a_rise_below_the_absolute_floor_is_not_a_rise():
    values = [1e-13] * 20 + [1e-11] * 20  # fp32 rounding noise growing 100x: still no gap
    assert rise_step(list(range(40)), values, min_level=1e-5) is None
    assert rise_step(list(range(40)), [0.0] * 20 + [1e-3] * 20, min_level=1e-5) == 20
