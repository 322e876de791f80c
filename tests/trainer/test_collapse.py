"""Collapse detector (docs/design.md 3.6) on constructed and synthetic accuracy series."""

import json
import math
import random

import pytest

from trainer.analysis.collapse import CollapseDetector, binomial_std, detect_from_rows
from trainer.config import CollapseConfig

SAMPLES = 128  # 16 prompts x 8 answers: the study's batch
CFG = CollapseConfig()


def run(series, finite=None, cfg=CFG, samples=SAMPLES, evals=None):
    det = CollapseDetector(cfg, samples=samples, eval_samples=128)
    fired = []
    for step, acc in enumerate(series):
        if evals and step in evals:
            det.update_eval(step, evals[step])
        fired.append(det.update(step, acc, True if finite is None else finite[step]))
    return det, fired


def noisy(levels, seed=0, samples=SAMPLES):
    """Batch accuracies: one binomial draw of ``samples`` answers at each step's true rate."""
    rng = random.Random(seed)
    return [sum(rng.random() < p for _ in range(samples)) / samples for p in levels]


def test_margin_and_threshold_by_hand():
    det, _ = run([0.3] * 5)
    # best .3; sigma = sqrt(.3 x .7 / 128) = .040505; median of 5: x sqrt(pi/2) / sqrt(5)
    sigma_median = math.sqrt(0.3 * 0.7 / 128) * math.sqrt(math.pi / 2) / math.sqrt(5)
    # a constant series has no observed noise: the binomial bound applies
    assert det.margin() == pytest.approx(4 * math.sqrt(2) * sigma_median)  # = .1284
    assert det.margin() == pytest.approx(0.1284, abs=1e-4)
    assert det.threshold == pytest.approx(0.15)  # min(.5 x .3, .3 - .1284)
    assert binomial_std(0.5, 100) == pytest.approx(0.05)


def test_collapse_by_drop_dates_the_first_step_of_the_fall():
    # median of 5 exists from step 4 (best .4); the raw series falls to .05 at step 8, the
    # median follows at step 10 (3 of 5 low); patience 3 -> known at 12, dated 10 - 2 = 8.
    series = [0.4] * 8 + [0.05] * 12
    det, fired = run(series)
    assert fired.index(True) == 12 and sum(fired) == 1
    assert det.collapsed and det.collapse_step == 8
    assert det.best == 0.4
    assert det.collapse_reason.startswith(
        "reward/accuracy running median (5 steps) fell below 0.2 = min(0.5 x best 0.4"
    )


def test_collapse_on_non_finite_loss_is_final():
    finite = [True, True, True, False, True]
    det, fired = run([0.5] * 5, finite)
    assert fired == [False, False, False, True, False]
    assert det.collapse_step == 3 and det.final
    assert det.collapse_reason == "non-finite loss or gradient at step 3"


def test_nan_accuracy_is_skipped_not_a_collapse():
    det, _ = run([0.5, float("nan"), 0.5, 0.5, 0.5, 0.5])
    assert not det.collapsed and det.moving_average == 0.5


def test_real_collapse_on_a_noisy_run_is_detected_within_a_few_steps():
    # true rate climbs .2 -> .35 over 40 steps, then decays to .02 from step 60 over 10 steps
    levels = [0.2 + 0.15 * min(t, 40) / 40 for t in range(60)]
    levels += [max(0.35 * (1 - (t + 1) / 10), 0.02) for t in range(10)] + [0.02] * 60
    det, fired = run(noisy(levels, seed=1))
    assert det.collapsed and det.final
    assert 60 <= det.collapse_step <= 68  # the fall starts at 60 and halves the rate by 65
    assert fired.index(True) <= 72


def test_fast_collapse_at_step_5_is_caught_before_step_10():
    det, fired = run(noisy([0.3] * 5 + [0.0] * 30, seed=2))
    assert det.collapsed and det.collapse_step == 5
    assert fired.index(True) <= 9


def test_low_accuracy_collapse_is_caught():
    # best stays below 0.1 (the old rule's blind spot): .08 -> .005
    det, _ = run(noisy([0.08] * 40 + [0.005] * 60, seed=3))
    assert det.collapsed and 38 <= det.collapse_step <= 45


def test_a_small_level_drop_is_seen_only_by_the_slow_scale():
    # .03 -> .01 at 128 answers a step: sigma(.03) = .015; the fast median's margin exceeds
    # the best, so the fast scale is never armed ...
    series = noisy([0.03] * 40 + [0.01] * 60, seed=4)
    det, _ = run(series, cfg=CollapseConfig(slow_window=0))
    assert not det.collapsed and not det.armed
    # ... while 20 steps of 128 answers resolve it: the slow mean catches the sustained fall
    det, _ = run(series)
    assert det.collapsed and "running mean (20 steps)" in det.collapse_reason


def test_a_partial_drop_is_not_a_collapse():
    det, _ = run(noisy([0.3] * 40 + [0.2] * 100, seed=7))  # a third lost, not half
    assert not det.collapsed


def test_slow_decline_is_caught_by_the_slow_scale():
    # 0.19 -> 0.06 over steps 20-70 with a step noise of about .06 (16 prompts' worth)
    rng = random.Random(8)
    levels = [0.19] * 20 + [0.19 - 0.13 * t / 50 for t in range(50)] + [0.06] * 60
    series = [min(max(p + rng.gauss(0, 0.06), 0.0), 1.0) for p in levels]
    fast_only, _ = run(series, cfg=CollapseConfig(slow_window=0))
    assert not fast_only.collapsed
    det, _ = run(series)
    assert det.collapsed and det.final and 30 <= det.collapse_step <= 75
    assert "running mean" in det.collapse_reason


def test_transient_dip_that_recovers_is_revoked():
    levels = [0.35] * 30 + [0.05] * 8 + [0.35] * 50
    det, fired = run(noisy(levels, seed=5))
    assert any(fired)  # the dip is flagged while it lasts ...
    assert not det.collapsed and det.collapse_step is None  # ... and revoked on recovery
    assert len(det.revoked) == 1 and 28 <= det.revoked[0][0] <= 33
    assert "revoked: running median" in det.revoked[0][1]


def test_held_out_accuracy_within_noise_revokes_and_a_held_out_drop_confirms():
    series = noisy([0.35] * 30 + [0.05] * 40, seed=6)
    det, _fired = run(series[:36], evals={0: 0.30, 25: 0.32})
    assert det.collapsed and not det.final  # provisional: flagged at step 34
    det.update_eval(36, 0.31)
    assert not det.collapsed and "held-out accuracy 0.31" in det.revoked[0][1]
    det, _ = run(series, evals={0: 0.30, 25: 0.32, 36: 0.04})
    assert det.collapsed and det.final and "confirmed by held-out" in det.collapse_reason


def test_a_collapse_without_recovery_becomes_final_after_the_window():
    det, _fired = run([0.4] * 8 + [0.05] * 40)
    assert det.collapsed and det.final and det.flagged_at == 12


@pytest.mark.parametrize("level", [0.03, 0.05, 0.1, 0.2, 0.4, 0.6])
def test_noise_only_runs_are_never_flagged(level):
    for seed in range(5):
        det, _ = run(noisy([level] * 400, seed=100 + seed))
        assert not det.collapsed and not det.revoked, (level, seed)


def test_resume_from_state_gives_the_same_result():
    series = [0.4] * 8 + [0.05] * 12
    first = CollapseDetector(CFG, SAMPLES)
    for step in range(11):  # stops inside the below-threshold stretch (it began at step 10)
        first.update(step, series[step])
    assert first.below_since == 10 and not first.collapsed
    second = CollapseDetector(CFG, SAMPLES)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    fired = [second.update(step, series[step]) for step in range(11, 20)]
    assert fired.index(True) == 1 and second.collapse_step == 8


def test_old_checkpoint_state_loads():
    old = {"history": [0.4] * 5, "moving_average": 0.4, "best": 0.4, "below_since": None,
           "below_count": 0, "collapsed": False, "collapse_step": None, "collapse_reason": None}  # fmt: skip
    det = CollapseDetector(CFG, SAMPLES)
    det.load_state_dict(old)
    assert det.best == 0.4 and det.revoked == [] and det.best_eval is None


def test_detect_from_rows_rejudges_a_metrics_file():
    rows = [{"step": t, "reward/accuracy": a} for t, a in enumerate([0.4] * 8 + [0.05] * 12)]
    rows[0]["eval/accuracy"] = 0.4
    det = detect_from_rows(rows, CFG, SAMPLES, 128)
    assert det.collapsed and det.collapse_step == 8 and det.best_eval == 0.4


def test_removed_floor_field_still_loads_with_a_deprecation_note():
    from trainer.config.migration import migrate

    data, notes = migrate({"run": {"collapse": {"floor": 0.1, "window": 7}}})
    assert data == {"run": {"collapse": {"window": 7}}}
    assert notes == [
        "run.collapse.floor is removed (ignored): the drop rule is armed by the batch "
        "noise margin, run.collapse.noise_z"
    ]


def test_a_held_out_set_too_small_to_resolve_a_collapse_is_no_evidence():
    series = noisy([0.35] * 30 + [0.05] * 40, seed=6)
    det, _ = run(series[:36], evals={0: 0.08})  # best .08 at 128: noise line < 0
    det.update_eval(36, 0.07)
    assert det.collapsed and not det.revoked
