"""``model.mla``, ``model.router`` and ``model.expert_ffn``: the attention, routing and
expert features of DeepSeek-V2/V3, GLM-4.5 and GPT-OSS (docs/models.md).

Defaults are the builtin model's (multi-head attention, a softmax router without
groups, plain SwiGLU experts), so a config that sets none of them is unchanged.
The formulas live in ``trainer.model.mla``, ``trainer.model.routing`` and
``trainer.model.activations``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainer.config.section import Section


class MlaConfig(Section):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, sec. 2.1): keys and
    values come from one low-rank latent per token (``kv_lora_rank``), plus a small
    rotary key shared by the heads; the rollout engine caches only those."""

    enabled: bool = Field(
        False, description="Use multi-head latent attention instead of (grouped) multi-head."
    )
    q_lora_rank: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Rank of the query compression (DeepSeek-V3: 1536); empty = a full-rank "
        "query projection (DeepSeek-V2-Lite).",
    )
    kv_lora_rank: int = Field(
        32, ge=1, le=65536, description="Width of the key/value latent each token caches."
    )
    qk_nope_head_dim: int = Field(
        16, ge=1, le=1024, description="Per-head query/key width without rotary embedding."
    )
    qk_rope_head_dim: int = Field(
        16, ge=2, le=1024, description="Per-head query/key width with rotary embedding (even)."
    )
    v_head_dim: int = Field(16, ge=1, le=1024, description="Per-head value width.")

    @model_validator(mode="after")
    def _check(self) -> MlaConfig:
        if self.qk_rope_head_dim % 2:
            raise ValueError("qk_rope_head_dim: rotary embeddings need an even width")
        return self

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class RouterConfig(Section):
    """How a token's experts are chosen and weighted (``trainer.model.routing``)."""

    score: Literal["softmax", "sigmoid"] = Field(
        "softmax",
        description="softmax: gates from softmax(logits) (Mixtral, Qwen, DeepSeek-V2, GPT-OSS); "
        "sigmoid: independent sigmoid(logits) affinities, the selection bias added to "
        "them (DeepSeek-V3, GLM-4.5).",
    )
    bias: bool = Field(
        False, description="A learned bias on the router logits (GPT-OSS); trained with it."
    )
    n_groups: int = Field(
        1,
        ge=1,
        le=512,
        description="Group-limited routing (DeepSeek): the experts split into n_groups equal "
        "groups and a token picks its top_k only inside its topk_groups best groups; 1 = off.",
    )
    topk_groups: int = Field(
        1, ge=1, le=512, description="Groups a token may route into (DeepSeek topk_group)."
    )
    group_score: Literal["top2_sum", "max"] = Field(
        "top2_sum",
        description="A group's score: the sum of its two best selection scores (DeepSeek-V3, "
        "GLM-4.5) or its best one (DeepSeek-V2 group_limited_greedy).",
    )
    scaling: float = Field(
        1.0,
        gt=0,
        le=1000.0,
        description="routed_scaling_factor: the routed experts' gates are multiplied by it "
        "(DeepSeek-V3: 2.5).",
    )

    @model_validator(mode="after")
    def _check(self) -> RouterConfig:
        if self.topk_groups > self.n_groups:
            raise ValueError(
                f"topk_groups: topk_groups ({self.topk_groups}) cannot exceed n_groups "
                f"({self.n_groups})"
            )
        return self

    @property
    def grouped(self) -> bool:
        return self.n_groups > 1 and self.topk_groups < self.n_groups


class ExpertFfnConfig(Section):
    """The routed experts' FFN (``trainer.model.activations``)."""

    bias: bool = Field(
        False, description="Biases on the experts' gate, up and down projections (GPT-OSS)."
    )
    activation: Literal["swiglu", "clamped_swiglu"] = Field(
        "swiglu",
        description="swiglu: silu(gate) * up; clamped_swiglu (GPT-OSS): gate clamped above at "
        "limit, up to [-limit, limit], then (up + 1) * gate * sigmoid(alpha * gate).",
    )
    alpha: float = Field(1.702, gt=0, le=100.0, description="clamped_swiglu: the sigmoid's slope.")
    limit: float = Field(7.0, gt=0, le=1e6, description="clamped_swiglu: the clamp bound.")
