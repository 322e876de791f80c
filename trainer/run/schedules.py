"""Per-step schedules: learning rate, prompts per step, entropy coefficient.

Steps count from 0; ``total_steps`` is run.steps, so the last step is
``total_steps - 1``. All functions are pure and take the config sections.
"""

from __future__ import annotations

import math

from trainer.config import OptimConfig, RolloutConfig


def lr_at(step: int, total_steps: int, optim_cfg: OptimConfig) -> float:
    """Learning rate at ``step``.

    Linear warmup over ``warmup_steps``: ``lr * (step + 1) / warmup_steps`` (so
    step 0 already moves). Then either constant ``lr``, or cosine from ``lr``
    at step ``warmup_steps`` down to ``lr_min`` at the last step:
    ``lr_min + (lr - lr_min) * (1 + cos(pi * p)) / 2`` with
    ``p = (step - warmup) / (total_steps - 1 - warmup)`` clamped to [0, 1].
    """
    lr, warmup = optim_cfg.lr, optim_cfg.warmup_steps
    if step < warmup:
        return lr * (step + 1) / warmup
    if optim_cfg.lr_schedule == "constant":
        return lr
    span = max(total_steps - 1 - warmup, 1)
    progress = min(max((step - warmup) / span, 0.0), 1.0)
    return optim_cfg.lr_min + (lr - optim_cfg.lr_min) * 0.5 * (1.0 + math.cos(math.pi * progress))


def prompts_at(step: int, rollout_cfg: RolloutConfig, optim_cfg: OptimConfig) -> int:
    """Prompts per step under the linear batch-size ramp.

    From ``optim.batch_ramp_start`` at step 0 to ``rollout.prompts_per_step`` at
    step ``optim.batch_ramp_steps`` and after, rounded to the nearest integer.
    No ramp (``batch_ramp_start`` empty or ``batch_ramp_steps`` 0): always
    ``rollout.prompts_per_step``.
    """
    target = rollout_cfg.prompts_per_step
    start, ramp = optim_cfg.batch_ramp_start, optim_cfg.batch_ramp_steps
    if start is None or ramp <= 0 or step >= ramp:
        return target
    return round(start + (target - start) * max(step, 0) / ramp)


def entropy_coef_at(step: int, total_steps: int, optim_cfg: OptimConfig) -> float:
    """Entropy-bonus coefficient: linear from ``entropy_coef_start`` at step 0 to
    ``entropy_coef_end`` at the last step (``total_steps - 1``), constant after."""
    start, end = optim_cfg.entropy_coef_start, optim_cfg.entropy_coef_end
    span = max(total_steps - 1, 1)
    progress = min(max(step / span, 0.0), 1.0)
    return start + (end - start) * progress
