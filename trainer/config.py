"""The ONE config schema shared by the trainer CLI, the REST API and the browser form.

Every field has a default and help text; unknown keys and wrong types are
rejected with the field's dotted path (``algorithm.clip_eps_low: ...``) so the
CLI, the API and the form can all point at the offending field.

Sections: model, task, warm_start, rollout, algorithm, stabilizers, optim, run, parallel.
``task`` is one model per task kind, picked by ``task.name`` (arithmetic | sort | text);
``stabilizers`` has one sub-section per owner (replay, balance, surgery,
is_correction, router_temperature, noisy_gating). The previous release's flat
paths still load for one release (``trainer.config_migration``), with a
``ConfigDeprecationWarning`` naming the new path.
Presets (``trainer.presets``) are partial configs layered over these defaults,
never code paths.
"""

from __future__ import annotations

import copy
import hashlib
import json
import string
import warnings
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainer.algorithms.registry import ALGORITHMS, Algorithm
from trainer.config_migration import migrate
from trainer.errors import FieldError


class ConfigDeprecationWarning(FutureWarning):
    """A config used a path of the previous release; the message names the new one.

    A FutureWarning so Python shows it by default: it is meant for the person
    who wrote the config, not only for developers.
    """


class Section(BaseModel):
    """Base for every config section: strict types, no unknown keys."""

    model_config = ConfigDict(
        extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False
    )


# --------------------------------------------------------------------------- model
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
        "builtin", "qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "qwen3", "qwen2", "llama"
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
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads: n_heads ({self.n_heads}) must divide d_model ({self.d_model}); "
                "pick n_heads from the divisors of d_model"
            )
        if self.positional == "rope" and self.resolved_head_dim % 2:
            raise ValueError(
                "positional: rotary embeddings need an even head dimension (d_model / n_heads)"
            )
        self._check_hf_fields()
        if self.n_experts and self.top_k > self.n_experts:
            raise ValueError(
                f"top_k: top_k ({self.top_k}) cannot exceed n_experts ({self.n_experts}); "
                "lower top_k or add experts"
            )
        return self

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
    def resolved_dense_hidden(self) -> int:
        return self.dense_hidden or self.top_k * self.expert_hidden


# --------------------------------------------------------------------------- task
class TaskBase(Section):
    """Fields every task kind shares; ``name`` picks the kind (a tagged union)."""

    format_reward: float = Field(
        0.0,
        ge=0.0,
        le=0.5,
        description="Reward for a well-formed but wrong answer; 0 = strictly verifiable.",
    )
    eval_size: int = Field(
        256,
        ge=8,
        le=100000,
        description="Held-out evaluation problems; capped at the held-out 10% of a small "
        "problem space (e.g. 10 for 1-digit addition).",
    )
    eval_seed: int = Field(
        12345, ge=0, description="Seed of the held-out set (kept apart from run.seed)."
    )


class ArithmeticTaskConfig(TaskBase):
    name: Literal["arithmetic"] = Field(
        "arithmetic", description="arithmetic: multi-digit +, -, *."
    )
    operations: list[Literal["add", "sub", "mul"]] = Field(
        ["add"],  # pydantic copies a mutable default per instance
        min_length=1,
        description="Arithmetic operations drawn uniformly per problem.",
    )
    min_digits: int = Field(1, ge=1, le=12, description="Fewest digits per operand.")
    max_digits: int = Field(2, ge=1, le=12, description="Most digits per operand.")
    scratchpad: bool = Field(
        False,
        description="Ask for a digit-by-digit scratchpad before the answer (20+ token "
        "responses; the training-inference gap grows over a sequence's tokens).",
    )

    @model_validator(mode="after")
    def _check_digits(self) -> ArithmeticTaskConfig:
        if self.min_digits > self.max_digits:
            raise ValueError("min_digits: min_digits must be <= max_digits; raise max_digits")
        return self


class SortTaskConfig(TaskBase):
    name: Literal["sort"] = Field("sort", description="sort: sort a list of numbers.")
    min_len: int = Field(3, ge=2, le=32, description="Shortest list to sort.")
    max_len: int = Field(6, ge=2, le=32, description="Longest list to sort.")
    max_value: int = Field(99, ge=9, le=9999, description="Largest number in a list.")

    @model_validator(mode="after")
    def _check_lengths(self) -> SortTaskConfig:
        if self.min_len > self.max_len:
            raise ValueError("min_len: min_len must be <= max_len; raise max_len")
        return self


class TextTaskConfig(TaskBase):
    """A task read from a local JSONL/Parquet file (``trainer.tasks.text``, docs/models.md)."""

    name: Literal["text"] = Field(
        "text", description="text: prompts and verifiable answers from a local data file."
    )
    data_file: str = Field(
        "word_problems.jsonl",
        min_length=1,
        description="Absolute path of a .jsonl/.json/.parquet file (read with the datasets "
        "library), or the name of a file shipped in trainer/task_data (word_problems.jsonl).",
    )
    eval_file: str | None = Field(
        None,
        description="A separate held-out file (e.g. GSM8K's test.jsonl), same fields; empty = "
        "hold out about 10% of data_file's prompts by hash (as the built-in tasks do).",
    )
    prompt_field: str = Field("question", min_length=1, description="Row field of the prompt.")
    messages_field: str | None = Field(
        None,
        min_length=1,
        description='Row field holding the prompt as a conversation, [{"role": "system" | '
        '"user" | "assistant", "content": text}, ...] ending with a user turn (a '
        "system prompt, few-shot turns), rendered by the checkpoint's chat template; "
        "needs model.chat_template; prompt_field and prompt_template are then unused.",
    )
    prompt_template: str | None = Field(
        None,
        description="Python format string over the row's fields, e.g. 'Q: {question}\\nA:'; "
        "empty = the prompt_field as is.",
    )
    answer_field: str = Field(
        "answer",
        min_length=1,
        description="Row field of the answer; also the supervised warm-start response "
        "(a GSM8K answer: working, then '#### 42').",
    )
    verifier: Literal["numeric", "exact", "choice", "python"] = Field(
        "numeric",
        description="numeric: '####' (GSM8K) or \\boxed{} (MATH) answer within tolerance; "
        "exact: string match; choice: multiple-choice label; python: reward_function.",
    )
    tolerance: float = Field(
        1e-6,
        ge=0.0,
        le=1.0,
        description="numeric: correct when |pred - gold| <= tolerance * max(1, |gold|).",
    )
    choice_labels: str = Field(
        "ABCD",
        min_length=2,
        max_length=26,
        pattern="^[A-Z]+$",
        description="choice: the option labels, in order (a 0-based integer answer picks one).",
    )
    reward_function: str | None = Field(
        None,
        description="python: import path 'package.module:function' of "
        "fn(response: str, answer: str) -> float in [0, 1] (1 = correct).",
    )
    max_prompt_chars: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Rows whose prompt is longer (in characters) are skipped and counted, "
        "as verl's filter_overlong_prompts; empty = keep every row (a prompt too long for "
        "model.max_seq_len is then a config error).",
    )

    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Rows whose prompt takes more tokens (in the tokens the run speaks: the "
        "checkpoint's tokenizer, chat template and BOS included; bytes on the builtin model) "
        "are skipped and counted, as verl's filter_overlong_prompts; empty = keep every row.",
    )

    @field_validator("prompt_template")
    @classmethod
    def _plain_fields_only(cls, value: str | None) -> str | None:
        """Only plain ``{field}`` replacements: a format spec (``{q:>10000000}``), a
        conversion or an attribute/index lookup would let a template cost memory
        and time unrelated to the data (or reach into objects)."""
        if value is None:
            return value
        try:
            parts = list(string.Formatter().parse(value))
        except ValueError as exc:
            raise ValueError(f"not a format string: {exc}") from None
        for _, name, spec, conversion in parts:
            if name is None:
                continue
            if spec or conversion:
                raise ValueError(
                    f"{{{name}...}}: format specs and conversions are not allowed; "
                    "use plain {field} names"
                )
            if not name or not name.isidentifier():
                raise ValueError(f"{{{name}}}: use plain {{field}} names (no indexes, no dots)")
        return value

    @model_validator(mode="after")
    def _check_verifier(self) -> TextTaskConfig:
        if self.messages_field and self.prompt_template is not None:
            raise ValueError(
                "prompt_template: a conversation (messages_field) is rendered by the chat "
                "template; clear prompt_template or messages_field"
            )
        if self.verifier == "python" and not self.reward_function:
            raise ValueError(
                "reward_function: the python verifier needs an import path "
                "'package.module:function'"
            )
        if self.reward_function and self.verifier != "python":
            raise ValueError(
                "reward_function: only used with verifier='python'; set the verifier or clear it"
            )
        return self


TaskConfig = Annotated[
    ArithmeticTaskConfig | SortTaskConfig | TextTaskConfig, Field(discriminator="name")
]
"""One model per task kind, chosen by ``task.name``."""


# --------------------------------------------------------------------------- warm start
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


# --------------------------------------------------------------------------- rollout
class RolloutConfig(Section):
    precision: Literal["fp32", "bf16", "fp16", "fp8"] = Field(
        "bf16",
        description="Rollout engine precision. On CPU bf16/fp16 are emulated by rounding "
        "weights and activations around fp32 matmuls (as GPU GEMMs with fp32 accumulation). "
        "fp8: e4m3 weights and GEMM inputs with per-tensor scales, bf16 elsewhere (always "
        "emulated; trainer/rollout/numerics.py).",
    )
    prompts_per_step: int = Field(
        16, ge=1, le=65536, description="Prompts per RL step (before the batch-size ramp)."
    )
    group_size: int = Field(
        8, ge=1, le=1024, description="Responses sampled per prompt (the GRPO group)."
    )
    max_new_tokens: int = Field(16, ge=1, le=8192, description="Longest sampled response.")
    temperature: float = Field(1.0, gt=0, le=10.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1.0, description="Nucleus sampling mass; 1 = off.")
    kv_cache: bool = Field(True, description="Decode with a KV cache (off = full recompute).")
    router_noise: float = Field(
        0.0,
        ge=0.0,
        le=10.0,
        description="Routing-only training-inference gap: standard deviation (logit units) "
        "of a perturbation of the rollout engine's router selection scores before top-k; "
        "gates and every other path are unchanged (trainer/rollout/router_noise.py). "
        "0 = off. MoE only.",
    )
    router_noise_kind: Literal["fixed", "fresh"] = Field(
        "fixed",
        description="fixed: a fixed function of the router input (one random projection "
        "per layer, as a deterministic kernel difference); fresh: new noise at every call.",
    )


# --------------------------------------------------------------------------- algorithm
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


# --------------------------------------------------------------------------- stabilizers
class RouterTemperatureConfig(Section):
    enabled: bool = Field(False, description="Adapt the router softmax temperature.")
    initial: float = Field(1.0, gt=0, le=100.0, description="Starting temperature.")
    interval: int = Field(
        1000, ge=1, description="Steps between controller checks (scale down for short runs)."
    )
    min_utilization: float = Field(
        0.75, ge=0.0, le=1.0, description="Below this expert utilization, cool down."
    )
    cool_factor: float = Field(0.9, gt=0, le=1.0, description="Multiplier when cooling.")
    heat_factor: float = Field(1.1, ge=1.0, le=10.0, description="Multiplier on monopoly.")
    monopoly_share: float = Field(
        3.0,
        gt=1.0,
        description="Monopoly when one expert's load exceeds this multiple of its fair share.",
    )
    min_temperature: float = Field(0.1, gt=0, description="Lower bound.")
    max_temperature: float = Field(10.0, gt=0, description="Upper bound.")


class ReplayConfig(Section):
    """Routing replay (owner: ``trainer.stabilizers.replay`` and the loop's replay masks)."""

    mode: Literal["none", "r2", "r3"] = Field(
        "none",
        description="none; r3 = replay the rollout engine's routing in training (arXiv "
        "2510.11370); r2 = replay the old policy's training routing in updates (GSPO).",
    )
    warmup_steps: int = Field(
        0, ge=0, description="Steps over which a share of pairs keeps its own routing."
    )
    warmup_keep_frac: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="Share of (token, layer) pairs keeping the training router's choice at "
        "step 0, shrinking linearly to 0 over warmup_steps.",
    )
    compression: Literal["none", "rle", "zlib"] = Field(
        "none", description="Extra compression of the bit-packed routing indices."
    )


class BalanceConfig(Section):
    """Load balancing and router anchoring (owner: ``trainer.algorithms.balance``)."""

    aux_loss_coef: float = Field(
        0.0, ge=0.0, le=10.0, description="Switch load-balancing loss alpha; e.g. 0.01."
    )
    aux_loss_scope: Literal["global", "sequence"] = Field(
        "global", description="Balance over the whole batch or per sequence."
    )
    z_loss_coef: float = Field(0.0, ge=0.0, le=10.0, description="Router z-loss; e.g. 1e-3.")
    aux_free_bias: bool = Field(
        False, description="DeepSeek-V3 auxiliary-loss-free balancing bias (selection only)."
    )
    aux_free_bias_rate: float = Field(1e-3, gt=0, le=1.0, description="Bias update speed u.")
    lb_from_natural_routing: bool = Field(
        True,
        description="Balance losses use the router's natural top-k even under replay "
        "(as Megatron does); off = use the replayed experts.",
    )
    router_kl_coef: float = Field(
        0.0, ge=0.0, le=100.0, description="Router-anchoring KL to recent routings; e.g. 0.1."
    )
    router_kl_buffer_steps: int = Field(
        4, ge=1, le=1000, description="Recent steps kept in the router-anchoring buffer."
    )

    @property
    def has_routing_loss(self) -> bool:
        return self.aux_loss_coef > 0 or self.z_loss_coef > 0 or self.router_kl_coef > 0


class SurgeryConfig(Section):
    """Gradient surgery (owner: ``trainer.stabilizers.surgery_step``)."""

    enabled: bool = Field(
        False, description="PCGrad projection of routing-loss gradient off the policy gradient."
    )
    scope: Literal["router", "all"] = Field(
        "router", description="Parameters on which gradient surgery acts."
    )


class ISCorrectionConfig(Section):
    """Training-inference importance-sampling correction (owner: ``algorithms.is_correction``)."""

    kind: Literal["none", "tis", "mis", "icepop"] = Field(
        "none",
        description="none; tis = truncated token weights; mis = mask sequences; "
        "icepop = zero tokens outside a ratio band.",
    )
    tis_cap: float = Field(2.0, gt=0, description="TIS truncation C.")
    mis_low: float = Field(0.5, gt=0, description="MIS lower bound on the sequence ratio.")
    mis_high: float = Field(2.0, gt=0, description="MIS upper bound on the sequence ratio.")
    icepop_low: float = Field(0.5, gt=0, description="IcePop lower token-ratio bound.")
    icepop_high: float = Field(5.0, gt=0, description="IcePop upper token-ratio bound.")

    @model_validator(mode="after")
    def _check_bounds(self) -> ISCorrectionConfig:
        if self.mis_low >= self.mis_high:
            raise ValueError("mis_low: mis_low must be < mis_high; lower mis_low")
        if self.icepop_low >= self.icepop_high:
            raise ValueError("icepop_low: icepop_low must be < icepop_high; lower icepop_low")
        return self


class NoisyGatingConfig(Section):
    """Noisy top-k gating (owner: ``trainer.model.noisy_gating``)."""

    enabled: bool = Field(
        False, description="Noisy top-k gating (learned softplus noise scale, training only)."
    )
    init_std: float = Field(
        0.1,
        gt=0,
        le=10.0,
        description="Initial noise std, in units of the router logits / T "
        "(a trained tiny router's top-2 gaps are of order 0.1-1).",
    )


class StabilizersConfig(Section):
    """The MoE stabilizers, one sub-section per owner."""

    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    balance: BalanceConfig = Field(default_factory=BalanceConfig)
    surgery: SurgeryConfig = Field(default_factory=SurgeryConfig)
    is_correction: ISCorrectionConfig = Field(default_factory=ISCorrectionConfig)
    router_temperature: RouterTemperatureConfig = Field(default_factory=RouterTemperatureConfig)
    noisy_gating: NoisyGatingConfig = Field(default_factory=NoisyGatingConfig)


# --------------------------------------------------------------------------- optim
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
        "copies with fp32 moments (trainer/precision.py); the routers stay fp32.",
    )

    @model_validator(mode="after")
    def _check_lr(self) -> OptimConfig:
        if self.lr_min > self.lr:
            raise ValueError("lr_min: lr_min must be <= lr")
        return self


# --------------------------------------------------------------------------- run
class CollapseConfig(Section):
    """docs/design.md, "collapse definition": non-finite loss/gradient, or a sustained accuracy
    drop beyond the batch noise (trainer/collapse.py justifies every default)."""

    window: int = Field(5, ge=1, le=1000, description="Running-median window of batch accuracy.")
    drop_fraction: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="Collapse when the running median falls below this fraction of its best "
        "(and below the best by more than the noise margin).",
    )
    noise_z: float = Field(
        4.0,
        ge=0.0,
        le=20.0,
        description="Noise margin in standard deviations of the running median's difference "
        "(the larger of the binomial std at prompts_per_step x group_size answers and the run's "
        "own step-to-step noise).",
    )
    slow_window: int = Field(
        20,
        ge=0,
        le=10_000,
        description="Running-mean window of the slow scale that catches slow declines; 0 = off.",
    )
    patience: int = Field(3, ge=1, description="Steps the median must stay below the threshold.")
    recover_window: int = Field(
        20,
        ge=0,
        le=100_000,
        description="Steps after a collapse is flagged during which a recovery (or held-out "
        "accuracy within noise of its best) revokes it; 0 = every flag is final.",
    )


class RunConfig(Section):
    steps: int = Field(50, ge=1, le=10_000_000, description="RL steps to train.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of sampling and init.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto picks CUDA when present."
    )
    threads: int = Field(0, ge=0, le=1024, description="CPU threads; 0 = torch default.")
    deterministic: bool = Field(
        False,
        description="Deterministic kernels: torch.use_deterministic_algorithms (an op without "
        "a deterministic kernel is an error), CUBLAS_WORKSPACE_CONFIG=:4096:8 on CUDA, cuDNN "
        "benchmark off; the same seed then gives the same run on the same hardware. Costs "
        "speed on GPUs; summary.json records the mode (docs/gpu.md).",
    )
    tf32: bool = Field(
        False,
        description="Allow TF32 matmuls and convolutions on CUDA (Ampere and later): faster "
        "fp32 GEMMs with a 10-bit mantissa, which changes the numerics of an fp32 run. Off, "
        "the run checks that TF32 is off before it starts.",
    )
    gpus: int = Field(
        1,
        ge=1,
        le=64,
        description="Ranks of the run on each node (GPUs; CPU processes on a CPU device); more "
        "than 1 launches torchrun with that many ranks training one run (the parallel section).",
    )
    nodes: int = Field(
        1,
        ge=1,
        le=64,
        description="Hosts the run spans, run.gpus ranks on each (world size nodes x gpus). "
        "More than 1 is gang-scheduled by the platform's queue on that many workers, joined "
        "by torchrun's c10d rendezvous; the trainer CLI needs torchrun --nnodes for it.",
    )
    eval_every: int = Field(10, ge=1, description="Steps between held-out evaluations.")
    checkpoint_every: int = Field(10, ge=1, description="Steps between checkpoints.")
    stop_on_collapse: bool = Field(False, description="End the run at the collapse step.")
    collapse: CollapseConfig = Field(default_factory=CollapseConfig)


# --------------------------------------------------------------------------- parallel
class ParallelConfig(Section):
    """How the ``run.gpus`` ranks torchrun starts share one run (docs/distributed.md)."""

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="ddp: every rank holds the whole model, gradients are averaged "
        "(DistributedDataParallel); fsdp: parameters, gradients and optimizer state are "
        "sharded over the ranks (FSDP2 fully_shard, one unit per transformer block), for "
        "models that do not fit one device. Used only when run.gpus > 1.",
    )
    expert_parallel: int = Field(
        1,
        ge=1,
        le=512,
        description="Ranks each MoE layer's experts are sharded over (tokens travel to "
        "their experts' rank and back with all_to_all); 1 = off. run.gpus = data-parallel "
        "x expert_parallel; must divide model.n_experts and run.gpus. Under fsdp each rank's "
        "experts are also sharded over the ranks that hold the same experts.",
    )
    timeout_s: float = Field(
        600.0,
        ge=5.0,
        le=86_400.0,
        description="Seconds the rendezvous and every collective may wait; a rank that "
        "died makes the others fail with a timeout error after this long instead of hanging.",
    )


# Switches whose statistics are not yet reduced across ranks: rejected with run.gpus > 1.
_SINGLE_RANK_ONLY = {
    "stabilizers.surgery.enabled": "gradient surgery projects per-rank gradients",
    "stabilizers.balance.router_kl_coef": "the router-KL anchor is a per-rank marginal",
    "algorithm.advantage.ema_decay": "the reward EMA would see one rank's rewards",
    "algorithm.advantage.expert_zscore": "expert z-scores would use one rank's groups",
}


# --------------------------------------------------------------------------- root
class ExperimentConfig(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=ArithmeticTaskConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    stabilizers: StabilizersConfig = Field(default_factory=StabilizersConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)

    @model_validator(mode="before")
    @classmethod
    def _accept_old_shape(cls, data: Any) -> Any:
        """Rewrite the previous release's paths (``trainer.config_migration``) with a warning."""
        data, notes = migrate(data)
        for note in notes:
            warnings.warn(note, ConfigDeprecationWarning, stacklevel=2)
        return data

    @model_validator(mode="after")
    def _check_cross_section(self) -> ExperimentConfig:
        st = self.stabilizers
        moe_only = {
            "stabilizers.replay.mode": st.replay.mode != "none",
            "stabilizers.balance.aux_loss_coef": st.balance.aux_loss_coef > 0,
            "stabilizers.balance.z_loss_coef": st.balance.z_loss_coef > 0,
            "stabilizers.balance.router_kl_coef": st.balance.router_kl_coef > 0,
            "stabilizers.balance.aux_free_bias": st.balance.aux_free_bias,
            "stabilizers.noisy_gating.enabled": st.noisy_gating.enabled,
            "rollout.router_noise": self.rollout.router_noise > 0,
        }
        if not self.model.is_moe:
            on = [path for path, active in moe_only.items() if active]
            if on:
                raise ValueError(
                    f"{on[0]}: {', '.join(on)} need an MoE model; set model.n_experts > 0 or turn them off"
                )
        if self.algorithm.advantage.expert_zscore and (
            not self.model.is_moe
            or self.algorithm.advantage.expert_zscore_layer >= self.model.n_layers
        ):
            raise ValueError(
                "algorithm.advantage.expert_zscore: expert z-scored advantages need an MoE model and "
                "expert_zscore_layer < model.n_layers"
            )
        if getattr(self.task, "messages_field", None) and not self.model.chat_template:
            raise ValueError(
                "task.messages_field: a conversation is rendered by the checkpoint's chat "
                "template; set model.chat_template (and model.source) or use prompt_field"
            )
        if st.is_correction.kind != "none" and self.algorithm.behavior_logprobs == "rollout":
            # With rollout behaviour log-probs the clipped ratio is already
            # pi_theta / pi_rollout; TIS/MIS/IcePop would multiply by
            # pi_old / pi_rollout again and correct the engine gap twice (verl's
            # bypass mode applies no IS weight to such a ratio for this reason).
            raise ValueError(
                f"stabilizers.is_correction.kind: {st.is_correction.kind!r} reweights by "
                "pi_old / pi_rollout, but algorithm.behavior_logprobs='rollout' already puts "
                "pi_rollout in the ratio's denominator: the engine gap would be corrected "
                "twice; use behavior_logprobs='train' with an IS correction, or kind='none'"
            )
        self._check_parallel()
        return self

    def _check_parallel(self) -> None:
        """Combinations of several ranks (run.gpus x run.nodes > 1) that cannot run, as
        field errors before any rank starts."""
        ranks = self.run.gpus * self.run.nodes
        ep = self.parallel.expert_parallel
        if ep > 1:
            problem = None
            if not self.model.is_moe:
                problem = "needs an MoE model; set model.n_experts > 0 or expert_parallel=1"
            elif self.model.n_experts % ep:
                problem = f"must divide model.n_experts={self.model.n_experts}"
            elif ranks % ep:
                problem = (
                    f"must divide the {ranks} ranks (run.gpus x run.nodes = data-parallel x {ep})"
                )
            if problem:
                raise ValueError(f"parallel.expert_parallel: {ep} {problem}")
        if ranks == 1:
            return
        if self.rollout.prompts_per_step < ranks:
            raise ValueError(
                f"rollout.prompts_per_step: {self.rollout.prompts_per_step} prompts cannot give "
                f"each of its {ranks} ranks (run.gpus x run.nodes) a prompt; raise it to >= {ranks} "
                "or lower run.gpus"
            )
        ramp = self.optim.batch_ramp_start
        if ramp is not None and ramp < ranks:
            raise ValueError(
                f"optim.batch_ramp_start: {ramp} prompts at step 0 cannot give each of "
                f"its {ranks} ranks (run.gpus x run.nodes) a prompt; raise it to >= {ranks}"
            )
        active = {
            "stabilizers.surgery.enabled": self.stabilizers.surgery.enabled,
            "stabilizers.balance.router_kl_coef": self.stabilizers.balance.router_kl_coef > 0,
            "algorithm.advantage.ema_decay": self.algorithm.advantage.ema_decay > 0,
            "algorithm.advantage.expert_zscore": self.algorithm.advantage.expert_zscore,
        }
        for path, on in active.items():
            if on:
                raise ValueError(
                    f"{path}: not supported with run.gpus > 1 ({_SINGLE_RANK_ONLY[path]}); "
                    "turn it off or set run.gpus=1"
                )
        if self.parallel.strategy == "fsdp" and self.optim.per_expert_grad_clip > 0:
            raise ValueError(
                "optim.per_expert_grad_clip: per-expert clipping needs whole expert gradients, "
                "which fsdp shards; set parallel.strategy=ddp or per_expert_grad_clip=0"
            )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def hash(self, *sections: str) -> str:
        """Stable short hash of the given sections (all when none): keys caches."""
        data = self.to_dict()
        if sections:
            data = {name: data[name] for name in sections}
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- dict helpers
def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursively merge ``override`` into a copy of ``base`` (lists are replaced)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is JSON when it parses, else a plain string."""
    if "=" not in item:
        raise FieldError([(item, "an override must look like section.field=value")])
    path, raw = item.split("=", 1)
    keys = [k for k in path.strip().split(".") if k]
    if not keys:
        raise FieldError([(item, "an override needs a field path before '='")])
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return keys, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set a.b=value`` overrides to a nested dict (copy)."""
    out = copy.deepcopy(data)
    for item in overrides:
        keys, value = parse_override(item)
        node = out
        for key in keys[:-1]:
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            elif not isinstance(child, dict):
                raise FieldError([(".".join(keys), f"'{key}' is not a section")])
            node = child
        node[keys[-1]] = value
    return out


def json_schema() -> dict[str, Any]:
    """JSON Schema of the full config (served by the API, shown by the CLI)."""
    return ExperimentConfig.model_json_schema()
