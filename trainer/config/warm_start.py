"""``warm_start``: the supervised phase before RL step 0."""

from __future__ import annotations

from pydantic import Field, model_validator

from trainer.config.section import Section


class WarmStartConfig(Section):
    enabled: bool = Field(
        True, description="Supervised warm-start so RL starts from a sometimes-right policy."
    )
    target_accuracy_low: float = Field(
        0.2, ge=0.0, le=1.0, description="Stop SFT once held-out accuracy reaches this..."
    )
    target_accuracy_high: float = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="...but never above this (an already solved task leaves RL nothing).",
    )
    max_steps: int = Field(3000, ge=0, le=1_000_000, description="Upper bound on SFT steps.")
    batch_size: int = Field(64, ge=1, le=65536, description="SFT sequences per step.")
    lr: float = Field(3e-3, gt=0, le=1.0, description="SFT learning rate (AdamW).")
    eval_every: int = Field(50, ge=1, description="SFT steps between accuracy checks.")
    eval_size: int = Field(128, ge=8, description="Problems per SFT accuracy check (greedy).")
    aux_loss_coef: float = Field(
        0.0,
        ge=0.0,
        le=10.0,
        description="Switch load-balancing loss weight during the warm start (MoE): keeps "
        "the base's experts alive, so its routing has near-ties. 0 = off.",
    )
    cache: bool = Field(True, description="Reuse a base policy trained with the same config hash.")
    seed: int = Field(
        0,
        ge=0,
        le=2**31 - 1,
        description="Seed of the base policy. Kept apart from run.seed so that the seeds of a "
        "study start from the same base model, as RL runs start from one pretrained model.",
    )

    @model_validator(mode="after")
    def _check_band(self) -> WarmStartConfig:
        if self.target_accuracy_low > self.target_accuracy_high:
            raise ValueError(
                "target_accuracy_low: target_accuracy_low must be <= target_accuracy_high"
            )
        return self
