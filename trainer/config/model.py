"""``model``: the network's shape, or a Hugging Face checkpoint to load, and its tokenizer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainer.config.model_parts import ExpertFfnConfig, MlaConfig, RouterConfig
from trainer.config.section import Section


class RopeScalingConfig(Section):
    """Rotary scaling for long contexts, as transformers' ``rope_parameters``
    (``trainer.model.layers.rope_frequencies`` holds the formulas)."""

    kind: Literal["default", "linear", "dynamic", "yarn", "llama3"] = Field(
        "default",
        description="default: plain RoPE; linear: positions / factor (Chen et al. 2023); "
        "dynamic: NTK base grown past max_positions (dynamic NTK); yarn: YaRN (Peng et "
        "al. 2023, Qwen long context); llama3: Llama 3.1's banded frequency scaling.",
    )
    factor: float = Field(1.0, gt=0, le=1024.0, description="Context-extension factor.")
    max_positions: int | None = Field(
        None,
        ge=1,
        le=16_777_216,
        description="yarn/llama3: the pretraining context (original_max_position_embeddings); "
        "dynamic: the context past which the base grows (max_position_embeddings).",
    )
    low_freq_factor: float = Field(1.0, gt=0, description="llama3: low-frequency band edge.")
    high_freq_factor: float = Field(4.0, gt=0, description="llama3: high-frequency band edge.")
    beta_fast: float = Field(32.0, gt=0, description="yarn: rotations where extrapolation ends.")
    beta_slow: float = Field(1.0, gt=0, description="yarn: rotations where interpolation starts.")
    attention_factor: float | None = Field(
        None,
        gt=0,
        description="yarn: cos/sin multiplier; empty = 0.1 ln(factor) + 1 (YaRN eq. 21).",
    )
    truncate: bool = Field(True, description="yarn: round the correction range to whole dims.")
    mscale_all_dim: float | None = Field(
        None,
        gt=0,
        description="yarn with multi-head latent attention (DeepSeek): the attention softmax "
        "scale is also multiplied by (0.1 mscale_all_dim ln(factor) + 1)^2; empty = not.",
    )

    @model_validator(mode="after")
    def _check_kind(self) -> RopeScalingConfig:
        if self.kind in ("dynamic", "yarn", "llama3") and self.max_positions is None:
            raise ValueError(f"max_positions: rope scaling '{self.kind}' needs max_positions")
        if self.kind == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("high_freq_factor: must exceed low_freq_factor")
        return self


# What the lab itself passes to a chat template (trainer/hf/tokenizer.py): not settable
# through model.chat_template_kwargs.
RESERVED_TEMPLATE_VARIABLES = frozenset(
    {"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "documents"}
)


class ModelConfig(Section):
    vocab_size: int | None = Field(
        None,
        ge=8,
        description="Vocabulary size; leave empty to take it from the task's tokenizer.",
    )
    n_layers: int = Field(2, ge=1, le=256, description="Number of transformer blocks.")
    d_model: int = Field(128, ge=16, le=8192, description="Residual stream width.")
    n_heads: int = Field(4, ge=1, le=128, description="Attention heads; must divide d_model.")
    n_experts: int = Field(
        8, ge=0, le=512, description="Experts per MoE layer; 0 makes every FFN dense."
    )
    top_k: int = Field(2, ge=1, le=16, description="Experts each token is routed to.")
    expert_hidden: int = Field(
        256, ge=8, le=65536, description="Hidden width of each expert (MoE) FFN."
    )
    dense_hidden: int | None = Field(
        None,
        ge=8,
        le=262144,
        description="Hidden width of the dense FFN; empty = top_k * expert_hidden, "
        "i.e. the same ACTIVE parameters as the MoE variant.",
    )
    shared_expert_hidden: int = Field(
        0, ge=0, le=65536, description="Hidden width of an always-on shared expert; 0 = none."
    )
    positional: Literal["rope", "learned"] = Field(
        "rope", description="Rotary position embeddings or learned absolute positions."
    )
    max_seq_len: int = Field(
        128, ge=8, le=32768, description="Longest prompt + response the model accepts."
    )
    norm_eps: float = Field(1e-5, gt=0, le=1e-2, description="RMSNorm epsilon.")
    tie_embeddings: bool = Field(True, description="Share input embedding and output head.")
    init_std: float = Field(0.02, gt=0, le=1.0, description="Std of the normal weight init.")
    # ---- Hugging Face architectures (docs/models.md). Defaults = the builtin model.
    source: str = Field(
        "builtin",
        min_length=1,
        description="'builtin' (the lab's own randomly initialised model) or the path of a "
        "local Hugging Face checkpoint folder (config.json + *.safetensors [+ tokenizer "
        "files]) whose architecture and weights the run starts from; its config.json then "
        "sets every shape field below.",
    )
    family: Literal[
        "builtin",
        "qwen3_moe",
        "qwen2_moe",
        "olmoe",
        "mixtral",
        "deepseek_v3",
        "deepseek_v2",
        "glm4_moe",
        "gpt_oss",
        "qwen3",
        "qwen2",
        "llama",
    ] = Field(
        "builtin",
        description="Hugging Face model_type this shape came from; `trainer export` writes "
        "that format ('builtin' exports an MoE as mixtral, a dense model as llama).",
    )
    n_kv_heads: int | None = Field(
        None,
        ge=1,
        le=128,
        description="Key/value heads for grouped-query attention (Ainslie et al. 2023); "
        "empty = n_heads (multi-head attention). Must divide n_heads.",
    )
    head_dim: int | None = Field(
        None,
        ge=2,
        le=1024,
        description="Per-head width; empty = d_model / n_heads (Qwen3 sets it explicitly).",
    )
    rope_theta: float = Field(
        10000.0, gt=0, description="Rotary base: theta_i = rope_theta^(-2i/head_dim)."
    )
    rope_scaling: RopeScalingConfig = Field(
        default_factory=RopeScalingConfig,
        description="Rotary scaling for long contexts (checkpoints: rope_parameters).",
    )
    sliding_window: int | None = Field(
        None,
        ge=1,
        le=16_777_216,
        description="Sliding-window attention: a query sees only the last sliding_window "
        "keys, itself included (Mistral/Mixtral, Qwen use_sliding_window); empty = full.",
    )
    sliding_layers: list[int] | None = Field(
        None,
        description="Block indices (0-based) that use the sliding window; empty = every "
        "block (Qwen's max_window_layers / layer_types pick some).",
    )
    qk_norm: Literal["none", "head", "full"] = Field(
        "none",
        description="RMSNorm on queries and keys before rotary: 'head' per head over "
        "head_dim (Qwen3), 'full' over the whole q / k projection (OLMoE).",
    )
    attention_bias: Literal["none", "qkv", "qkvo"] = Field(
        "none",
        description="Bias on the q/k/v projections (Qwen2) or also on the output "
        "projection (Llama/Qwen3 attention_bias=true).",
    )
    norm_topk_prob: bool = Field(
        True,
        description="Renormalise the top-k gate weights to sum to 1 (Mixtral, Qwen3-MoE); "
        "false uses the full-softmax probabilities as gates (Qwen2-MoE, OLMoE).",
    )
    shared_expert_gate: bool = Field(
        False,
        description="Scale the shared expert by sigmoid(x w_g), w_g (D,) (Qwen2-MoE); "
        "needs shared_expert_hidden > 0.",
    )
    dense_layers: list[int] = Field(
        default_factory=list,
        description="Block indices (0-based) whose FFN is dense (dense_hidden wide) in an "
        "MoE model (Qwen mlp_only_layers / decoder_sparse_step).",
    )
    rotary_fraction: float = Field(
        1.0,
        gt=0,
        le=1.0,
        description="Share of each head's dims that rotary embeddings rotate (the first ones; "
        "GLM-4.5's partial_rotary_factor 0.5); the rest carry no position.",
    )
    attention_sinks: bool = Field(
        False,
        description="A learned per-head sink logit in every attention softmax (GPT-OSS): "
        "probability mass a head may put on no token.",
    )
    mla: MlaConfig = Field(
        default_factory=MlaConfig, description="Multi-head latent attention (DeepSeek)."
    )
    router: RouterConfig = Field(
        default_factory=RouterConfig,
        description="Router scores, groups and scaling (DeepSeek, GLM-4.5, GPT-OSS).",
    )
    expert_ffn: ExpertFfnConfig = Field(
        default_factory=ExpertFfnConfig,
        description="The routed experts' biases and activation (GPT-OSS).",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each block's activations in the backward pass instead of "
        "storing them (less memory, about one extra forward of compute).",
    )
    chat_template: bool = Field(
        False,
        description="Wrap each task prompt as a user message in the checkpoint's chat "
        "template (tokenizer_config.json or chat_template.jinja, rendered with jinja2, "
        "generation prompt added) before encoding; needs model.source.",
    )
    chat_template_kwargs: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict,
        description="Extra variables the chat template sees, as transformers' "
        'apply_chat_template(**kwargs) passes them: e.g. {"enable_thinking": false} for '
        "Qwen3; needs model.chat_template.",
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        if not self.mla.enabled and self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads: n_heads ({self.n_heads}) must divide d_model ({self.d_model}); "
                "pick n_heads from the divisors of d_model"
            )
        if not self.mla.enabled and self.positional == "rope" and self.resolved_head_dim % 2:
            raise ValueError(
                "positional: rotary embeddings need an even head dimension (d_model / n_heads)"
            )
        self._check_hf_fields()
        self._check_attention_features()
        if self.n_experts and self.top_k > self.n_experts:
            raise ValueError(
                f"top_k: top_k ({self.top_k}) cannot exceed n_experts ({self.n_experts}); "
                "lower top_k or add experts"
            )
        self._check_router_groups()
        return self

    def _check_attention_features(self) -> None:
        """Multi-head latent attention replaces the q/k/v projections: the features of
        the other attention (q/k norms, biases, windows, sinks, partial rotary) are
        refused with it rather than ignored."""
        if not self.mla.enabled:
            rotary = self.resolved_rotary_dim
            if self.positional == "rope" and (rotary < 2 or rotary % 2):
                raise ValueError(
                    f"rotary_fraction: {self.rotary_fraction} of head_dim "
                    f"{self.resolved_head_dim} rotates {self.resolved_rotary_dim} dims; "
                    "rotary needs an even number, at least 2"
                )
            return
        clash = {
            "positional": self.positional != "rope",
            "qk_norm": self.qk_norm != "none",
            "attention_bias": self.attention_bias != "none",
            "sliding_window": self.sliding_window is not None,
            "attention_sinks": self.attention_sinks,
            "rotary_fraction": self.rotary_fraction != 1.0,
            "n_kv_heads": self.resolved_n_kv_heads != self.n_heads,
        }
        on = [name for name, bad in clash.items() if bad]
        if on:
            raise ValueError(
                f"{on[0]}: not available with multi-head latent attention (model.mla.enabled); "
                "reset it to its default"
            )

    def _check_router_groups(self) -> None:
        router = self.router
        if not (self.is_moe and router.grouped):
            return
        if self.n_experts % router.n_groups:
            raise ValueError(
                f"router: n_groups ({router.n_groups}) must divide n_experts ({self.n_experts})"
            )
        size = self.n_experts // router.n_groups
        if router.group_score == "top2_sum" and size < 2:
            raise ValueError("router: a top2_sum group score needs at least 2 experts per group")
        if self.top_k > router.topk_groups * size:
            raise ValueError(
                f"top_k: top_k ({self.top_k}) exceeds the {router.topk_groups * size} experts "
                f"of the topk_groups ({router.topk_groups}) groups a token may use"
            )

    def _check_hf_fields(self) -> None:
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_kv_heads: n_kv_heads ({self.n_kv_heads}) must divide n_heads "
                f"({self.n_heads}); each key/value head serves n_heads / n_kv_heads queries"
            )
        if self.shared_expert_gate and not self.shared_expert_hidden:
            raise ValueError(
                "shared_expert_gate: a shared-expert gate needs a shared expert; "
                "set shared_expert_hidden > 0 or turn the gate off"
            )
        bad = [i for i in self.dense_layers if not 0 <= i < self.n_layers]
        if bad:
            raise ValueError(
                f"dense_layers: block indices {bad} are outside 0..{self.n_layers - 1}"
            )
        if self.chat_template and self.source == "builtin":
            raise ValueError(
                "chat_template: only an imported checkpoint has a chat template; "
                "set model.source or turn chat_template off"
            )
        if self.chat_template_kwargs and not self.chat_template:
            raise ValueError("chat_template_kwargs: only used with model.chat_template on")
        taken = sorted(set(self.chat_template_kwargs) & RESERVED_TEMPLATE_VARIABLES)
        bad = [k for k in self.chat_template_kwargs if not k.isidentifier()]
        if taken or bad:
            raise ValueError(
                f"chat_template_kwargs: {(taken or bad)[0]!r} "
                + ("is set by the lab itself" if taken else "is not a template variable name")
            )
        if self.sliding_layers is not None:
            bad = [i for i in self.sliding_layers if not 0 <= i < self.n_layers]
            if bad:
                raise ValueError(
                    f"sliding_layers: block indices {bad} are outside 0..{self.n_layers - 1}"
                )
            if self.sliding_window is None:
                raise ValueError("sliding_layers: set sliding_window too, or clear the list")
        if self.rope_scaling.kind != "default" and self.positional != "rope":
            raise ValueError("rope_scaling: only rotary positions (positional=rope) scale")
        if len(set(self.dense_layers)) != len(self.dense_layers):
            raise ValueError("dense_layers: list each block index once")
        if self.dense_layers and not self.is_moe:
            raise ValueError(
                "dense_layers: only an MoE model (n_experts > 0) has sparse blocks to make dense"
            )

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def resolved_n_kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def resolved_rotary_dim(self) -> int:
        """The dims rotary embeddings rotate per head: the first ``rotary_fraction`` of
        head_dim (as transformers' ``int(head_dim * partial_rotary_factor)``), or the
        rope part of a latent-attention head."""
        if self.mla.enabled:
            return self.mla.qk_rope_head_dim
        return int(self.resolved_head_dim * self.rotary_fraction)

    def is_moe_block(self, index: int) -> bool:
        """Whether block ``index`` has a routed MoE FFN (else the dense SwiGLU)."""
        return self.is_moe and index not in self.dense_layers

    def uses_sliding_window(self, index: int) -> bool:
        """Whether block ``index`` attends through the sliding window."""
        if self.sliding_window is None:
            return False
        return self.sliding_layers is None or index in self.sliding_layers

    @property
    def n_moe_blocks(self) -> int:
        return sum(self.is_moe_block(i) for i in range(self.n_layers))

    @property
    def moe_block_indices(self) -> list[int]:
        """The blocks with a routed FFN, in order: the model layer of each routing
        record (expert-load keys ``experts/load/L{i}`` name these)."""
        return [i for i in range(self.n_layers) if self.is_moe_block(i)]

    @property
    def resolved_dense_hidden(self) -> int:
        return self.dense_hidden or self.top_k * self.expert_hidden
