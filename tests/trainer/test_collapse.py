"""Collapse detector (DESIGN.md 3.5) on constructed accuracy series."""

import json

from trainer.collapse import CollapseDetector
from trainer.config import CollapseConfig

CFG = CollapseConfig(window=2, drop_fraction=0.5, floor=0.3, patience=2)


def run(series, finite=None, cfg=CFG):
    det = CollapseDetector(cfg)
    fired = [
        det.update(step, acc, True if finite is None else finite[step])
        for step, acc in enumerate(series)
    ]
    return det, fired


def test_collapse_by_drop_dates_the_first_step_below():
    # moving averages (window 2) from step 1: .3 .5 .6 .4 .2 .15 .1 ; best .6 -> threshold .3
    # step 5 (.2) starts the stretch, step 6 (.15) completes patience 2
    det, fired = run([0.2, 0.4, 0.6, 0.6, 0.2, 0.2, 0.1, 0.1])
    assert fired == [False] * 6 + [True, False]
    assert det.collapsed and det.collapse_step == 5
    assert det.best == 0.6
    assert det.collapse_reason == (
        "reward/accuracy moving average fell below 0.5 of its best 0.6 "
        "(after passing floor 0.3) for 2 steps"
    )


def test_censored_when_the_drop_recovers():
    # averages from step 1: .6 .4 .2 (below .3, one step) .4 (reset) .6 .6
    det, fired = run([0.6, 0.6, 0.2, 0.2, 0.6, 0.6, 0.6])
    assert not any(fired)
    assert not det.collapsed
    assert det.collapse_step is None and det.collapse_reason is None


def test_collapse_on_non_finite_loss():
    finite = [True, True, True, False, True]
    det, fired = run([0.5, 0.5, 0.5, 0.5, 0.5], finite)
    assert fired == [False, False, False, True, False]
    assert det.collapse_step == 3
    assert det.collapse_reason == "non-finite loss or gradient at step 3"


def test_never_armed_below_the_floor():
    # best moving average .2 never reaches the floor .3, so a fall to 0 is not a collapse
    det, fired = run([0.2, 0.2, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert not any(fired) and not det.collapsed
    assert not det.armed


def test_nan_accuracy_is_skipped_not_a_collapse():
    det, _ = run([0.5, float("nan"), 0.5, 0.5])
    assert not det.collapsed and det.moving_average == 0.5


def test_resume_from_state_gives_the_same_result():
    series = [0.2, 0.4, 0.6, 0.6, 0.2, 0.2, 0.1, 0.1]
    first = CollapseDetector(CFG)
    for step in range(6):  # stops inside the below-threshold stretch (it began at step 5)
        first.update(step, series[step])
    assert first.below_since == 5 and not first.collapsed
    second = CollapseDetector(CFG)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    fired = [second.update(step, series[step]) for step in range(6, 8)]
    assert fired == [True, False]
    assert second.collapse_step == 5
