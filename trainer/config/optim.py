"""``optim``: the optimiser, learning rate, clipping and parameter precision."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainer.config.section import Section


class OptimConfig(Section):
    lr: float = Field(
        1e-4,
        ge=0,
        le=1.0,
        description="Peak learning rate (AdamW). 0 makes a null run: the policy never moves, "
        "so its batch accuracy is sampling noise around the base's (the collapse detector's "
        "false-positive runs).",
    )
    lr_min: float = Field(3e-5, ge=0, le=1.0, description="Learning rate at the end of cosine.")
    lr_schedule: Literal["cosine", "constant"] = Field(
        "cosine", description="Warmup then cosine decay to lr_min, or constant."
    )
    warmup_steps: int = Field(5, ge=0, description="Linear learning-rate warmup steps.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    beta2: float = Field(0.99, ge=0.0, lt=1.0, description="AdamW beta2.")
    grad_clip: float = Field(1.0, ge=0.0, description="Global gradient-norm clip; 0 = off.")
    batch_ramp_start: int | None = Field(
        None,
        ge=1,
        description="Prompts per step at step 0 of a linear batch-size ramp; empty = no ramp.",
    )
    batch_ramp_steps: int = Field(0, ge=0, description="Steps to reach rollout.prompts_per_step.")
    entropy_coef_start: float = Field(
        0.0, ge=0.0, le=1.0, description="Entropy bonus at step 0 (e.g. 0.01)."
    )
    entropy_coef_end: float = Field(
        0.0, ge=0.0, le=1.0, description="Entropy bonus at the last step (linear decay)."
    )
    per_expert_grad_clip: float = Field(
        0.0,
        ge=0.0,
        description="Clip each expert's gradient norm on its own, before grad_clip; "
        "0 = off, e.g. 1.",
    )
    expert_lr_scale: float = Field(
        1.0, gt=0, le=100.0, description="Learning-rate multiplier for expert parameters."
    )
    router_lr_scale: float = Field(
        1.0, gt=0, le=100.0, description="Learning-rate multiplier for router parameters."
    )
    param_dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Storage dtype of the policy's parameters in training: bf16 runs the "
        "training forward and backward on bf16 weights while AdamW updates fp32 master "
        "copies with fp32 moments (trainer/devices/precision.py); the routers stay fp32.",
    )

    logprobs: Literal["response", "full"] = Field(
        "response",
        description="Where the training forwards (measurement and update) apply the LM head "
        "and log-softmax. response: only at the positions whose next token is a response "
        "token (and, in the update, the response positions for the entropy), one fused "
        "log-softmax for log-probs and entropy (trainer/algorithms/logprobs.py). full: every "
        "position, z - logsumexp(z): the same numbers to fp32 rounding, kept by the studies "
        "run before response for their bits.",
    )

    @model_validator(mode="after")
    def _check_lr(self) -> OptimConfig:
        if self.lr_min > self.lr:
            raise ValueError("lr_min: lr_min must be <= lr")
        return self
