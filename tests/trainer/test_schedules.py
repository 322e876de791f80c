"""Schedules against hand-computed values."""

import pytest

from trainer.config import OptimConfig, RolloutConfig
from trainer.run.schedules import entropy_coef_at, lr_at, prompts_at


def test_warmup_then_cosine():
    cfg = OptimConfig(lr=1.0, lr_min=0.2, warmup_steps=2)
    # warmup: 1*(1/2), 1*(2/2) ; cosine over steps 2..5 (span 3):
    # p=0 -> 1.0 ; p=1/3 -> .2 + .8*(1+.5)/2 = .8 ; p=2/3 -> .2 + .8*(1-.5)/2 = .4 ; p=1 -> .2
    lrs = [lr_at(step, 6, cfg) for step in range(7)]
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.8, 0.4, 0.2, 0.2])


def test_constant_schedule_keeps_warmup():
    cfg = OptimConfig(lr=0.5, lr_min=0.0, warmup_steps=4, lr_schedule="constant")
    assert [lr_at(s, 10, cfg) for s in (0, 3, 4, 9)] == pytest.approx([0.125, 0.5, 0.5, 0.5])


def test_a_null_run_has_lr_zero_at_every_step_and_a_negative_lr_is_refused():
    cfg = OptimConfig(lr=0.0, lr_min=0.0)
    assert {lr_at(step, 150, cfg) for step in range(150)} == {0.0}
    with pytest.raises(ValueError, match="lr"):
        OptimConfig(lr=-1e-4)


def test_batch_ramp():
    rollout = RolloutConfig(prompts_per_step=16)
    optim = OptimConfig(batch_ramp_start=4, batch_ramp_steps=4)
    assert [prompts_at(s, rollout, optim) for s in range(6)] == [4, 7, 10, 13, 16, 16]
    assert prompts_at(0, rollout, OptimConfig()) == 16  # no ramp configured


def test_entropy_coefficient_linear_decay():
    cfg = OptimConfig(entropy_coef_start=0.01, entropy_coef_end=0.001)
    # over steps 0..9: 0.01 - 0.009 * step / 9
    assert entropy_coef_at(0, 10, cfg) == pytest.approx(0.01)
    assert entropy_coef_at(3, 10, cfg) == pytest.approx(0.007)
    assert entropy_coef_at(9, 10, cfg) == pytest.approx(0.001)
    assert entropy_coef_at(20, 10, cfg) == pytest.approx(0.001)
