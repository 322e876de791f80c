"""``algorithm``: PPO / GRPO / GSPO, clipping, advantages, behaviour log-probs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainer.algorithms.registry import ALGORITHMS, Algorithm
from trainer.config.section import Section


class AdvantageConfig(Section):
    std_normalize: bool = Field(
        True, description="Divide group-centred rewards by the group std (GRPO)."
    )
    ema_decay: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="EMA-smoothed reward normalisation: 0 = off, e.g. 0.99.",
    )
    expert_zscore: bool = Field(
        False,
        description="Z-score advantages within groups of sequences sharing the same "
        "dominant expert in layer expert_zscore_layer.",
    )
    expert_zscore_layer: int = Field(0, ge=0, description="MoE layer that defines the grouping.")


class AlgorithmConfig(Section):
    name: Literal["ppo", "grpo", "gspo"] = Field("grpo", description="Policy-gradient algorithm.")
    clip_eps_low: float | None = Field(
        None,
        gt=0,
        le=1.0,
        description="Lower clip range of the ratio; empty = algorithm default "
        "(0.2 for PPO/GRPO, 3e-4 for GSPO's sequence ratio).",
    )
    clip_eps_high: float | None = Field(
        None,
        gt=0,
        le=10.0,
        description="Upper clip range; empty = algorithm default (0.2; 4e-4 for GSPO).",
    )
    kl_coef: float = Field(
        0.04, ge=0.0, le=10.0, description="Beta of the k3 KL to the frozen reference policy."
    )
    loss_agg: Literal["token_mean", "seq_mean"] = Field(
        "token_mean",
        description="token_mean: mean over all tokens of the batch; seq_mean: mean over "
        "each sequence's tokens, then over sequences.",
    )
    minibatches: int = Field(
        4, ge=1, le=1024, description="Update minibatches per rollout batch (off-policy-ness)."
    )
    epochs: int = Field(1, ge=1, le=64, description="Passes over each rollout batch.")
    behavior_logprobs: Literal["train", "rollout"] = Field(
        "train",
        description="The ratio's old (behaviour) policy. train: the training engine's "
        "log-probs recomputed before the update (the engine gap enters only through "
        "sampling); rollout: the rollout engine's own log-probs, as some frameworks use, "
        "so the engine gap enters the ratio directly.",
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="PPO discount.")
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0, description="PPO GAE lambda.")
    value_coef: float = Field(0.5, ge=0.0, le=100.0, description="PPO value-loss weight.")
    value_clip: float = Field(
        0.2, ge=0.0, le=100.0, description="PPO value clipping range; 0 = off."
    )
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)

    @model_validator(mode="after")
    def _resolve_clip(self) -> AlgorithmConfig:
        # Resolved here so the stored config records the number actually used.
        spec = self.spec
        if self.clip_eps_low is None:
            object.__setattr__(self, "clip_eps_low", spec.clip_eps_low)
        if self.clip_eps_high is None:
            object.__setattr__(self, "clip_eps_high", spec.clip_eps_high)
        return self

    @property
    def spec(self) -> Algorithm:
        """This algorithm's row of ``trainer.algorithms.registry.ALGORITHMS``."""
        return ALGORITHMS[self.name]
