"""The ONE config schema shared by the trainer CLI, the REST API and the browser form.

Every field has a default and help text; unknown keys and wrong types are
rejected with the field's dotted path (``algorithm.clip_eps_low: ...``) so the
CLI, the API and the form can all point at the offending field.

Sections: model, task, warm_start, rollout, algorithm, stabilizers, optim, run.
Presets (``trainer.presets``) are partial configs layered over these defaults,
never code paths.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class Section(BaseModel):
    """Base for every config section: strict types, no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


# --------------------------------------------------------------------------- model
class ModelConfig(Section):
    vocab_size: int | None = Field(
        None,
        ge=8,
        description="Vocabulary size; leave empty to take it from the task's tokenizer.",
    )
    n_layers: int = Field(2, ge=1, le=64, description="Number of transformer blocks.")
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

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads: n_heads ({self.n_heads}) must divide d_model ({self.d_model}); "
                "pick n_heads from the divisors of d_model"
            )
        if self.positional == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError(
                "positional: rotary embeddings need an even head dimension (d_model / n_heads)"
            )
        if self.n_experts and self.top_k > self.n_experts:
            raise ValueError(
                f"top_k: top_k ({self.top_k}) cannot exceed n_experts ({self.n_experts}); "
                "lower top_k or add experts"
            )
        return self

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def resolved_dense_hidden(self) -> int:
        return self.dense_hidden or self.top_k * self.expert_hidden


# --------------------------------------------------------------------------- task
class TaskConfig(Section):
    name: Literal["arithmetic", "sort"] = Field(
        "arithmetic",
        description="arithmetic: multi-digit +, -, *; sort: sort a list of numbers.",
    )
    operations: list[Literal["add", "sub", "mul"]] = Field(
        default_factory=lambda: ["add"],
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
    sort_min_len: int = Field(3, ge=2, le=32, description="Shortest list for the sort task.")
    sort_max_len: int = Field(6, ge=2, le=32, description="Longest list for the sort task.")
    sort_max_value: int = Field(99, ge=9, le=9999, description="Largest number in a sort list.")
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

    @model_validator(mode="after")
    def _check_ranges(self) -> TaskConfig:
        if self.min_digits > self.max_digits:
            raise ValueError("min_digits: min_digits must be <= max_digits")
        if self.sort_min_len > self.sort_max_len:
            raise ValueError("sort_min_len: sort_min_len must be <= sort_max_len")
        return self


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
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "bf16",
        description="Rollout engine precision. On CPU bf16/fp16 are emulated by rounding "
        "weights and activations around fp32 matmuls (as GPU GEMMs with fp32 accumulation).",
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
        low, high = (3e-4, 4e-4) if self.name == "gspo" else (0.2, 0.2)
        if self.clip_eps_low is None:
            object.__setattr__(self, "clip_eps_low", low)
        if self.clip_eps_high is None:
            object.__setattr__(self, "clip_eps_high", high)
        return self


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


class StabilizersConfig(Section):
    routing_replay: Literal["none", "r2", "r3"] = Field(
        "none",
        description="none; r3 = replay the rollout engine's routing in training (arXiv "
        "2510.11370); r2 = replay the old policy's training routing in updates (GSPO).",
    )
    replay_warmup_steps: int = Field(
        0, ge=0, description="Steps over which a share of pairs keeps its own routing."
    )
    replay_warmup_keep_frac: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="Share of (token, layer) pairs keeping the training router's choice at "
        "step 0, shrinking linearly to 0 over replay_warmup_steps.",
    )
    replay_compression: Literal["none", "rle", "zlib"] = Field(
        "none", description="Extra compression of packed routing indices."
    )
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
    gradient_surgery: bool = Field(
        False, description="PCGrad projection of routing-loss gradient off the policy gradient."
    )
    surgery_scope: Literal["router", "all"] = Field(
        "router", description="Parameters on which gradient surgery acts."
    )
    router_temperature: RouterTemperatureConfig = Field(default_factory=RouterTemperatureConfig)
    noisy_gating: bool = Field(
        False, description="Noisy top-k gating (learned softplus noise scale, training only)."
    )
    noisy_gating_init_std: float = Field(
        0.1,
        gt=0,
        le=10.0,
        description="Initial noise std of noisy gating, in units of the router logits / T "
        "(a trained tiny router's top-2 gaps are of order 0.1-1).",
    )
    per_expert_grad_clip: float = Field(
        0.0, ge=0.0, description="Clip each expert's gradient norm on its own; 0 = off, e.g. 1."
    )
    expert_lr_scale: float = Field(
        1.0, gt=0, le=100.0, description="Learning-rate multiplier for expert parameters."
    )
    router_lr_scale: float = Field(
        1.0, gt=0, le=100.0, description="Learning-rate multiplier for router parameters."
    )
    is_correction: Literal["none", "tis", "mis", "icepop"] = Field(
        "none",
        description="Training-inference importance-sampling correction: tis = truncated "
        "token weights; mis = mask sequences; icepop = zero tokens outside a ratio band.",
    )
    tis_cap: float = Field(2.0, gt=0, description="TIS truncation C.")
    mis_low: float = Field(0.5, gt=0, description="MIS lower bound on the sequence ratio.")
    mis_high: float = Field(2.0, gt=0, description="MIS upper bound on the sequence ratio.")
    icepop_low: float = Field(0.5, gt=0, description="IcePop lower token-ratio bound.")
    icepop_high: float = Field(5.0, gt=0, description="IcePop upper token-ratio bound.")

    @model_validator(mode="after")
    def _check_bounds(self) -> StabilizersConfig:
        if self.mis_low >= self.mis_high:
            raise ValueError("mis_low: mis_low must be < mis_high")
        if self.icepop_low >= self.icepop_high:
            raise ValueError("icepop_low: icepop_low must be < icepop_high")
        return self


# --------------------------------------------------------------------------- optim
class OptimConfig(Section):
    lr: float = Field(1e-4, gt=0, le=1.0, description="Peak learning rate (AdamW).")
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

    @model_validator(mode="after")
    def _check_lr(self) -> OptimConfig:
        if self.lr_min > self.lr:
            raise ValueError("lr_min: lr_min must be <= lr")
        return self


# --------------------------------------------------------------------------- run
class CollapseConfig(Section):
    """DESIGN.md 3.5: non-finite loss/gradient, or a sustained accuracy drop."""

    window: int = Field(10, ge=1, description="Moving-average window of reward/accuracy.")
    drop_fraction: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="Collapse when the moving average falls below this fraction of its best.",
    )
    floor: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="The drop rule arms only after the best moving average passed this.",
    )
    patience: int = Field(10, ge=1, description="Steps the average must stay below the threshold.")


class RunConfig(Section):
    steps: int = Field(50, ge=1, le=10_000_000, description="RL steps to train.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of sampling and init.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto picks CUDA when present."
    )
    threads: int = Field(0, ge=0, le=1024, description="CPU threads; 0 = torch default.")
    gpus: int = Field(1, ge=1, le=64, description="GPUs; more than 1 launches torchrun.")
    eval_every: int = Field(10, ge=1, description="Steps between held-out evaluations.")
    checkpoint_every: int = Field(10, ge=1, description="Steps between checkpoints.")
    stop_on_collapse: bool = Field(False, description="End the run at the collapse step.")
    collapse: CollapseConfig = Field(default_factory=CollapseConfig)


# --------------------------------------------------------------------------- root
class ExperimentConfig(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    stabilizers: StabilizersConfig = Field(default_factory=StabilizersConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="after")
    def _check_cross_section(self) -> ExperimentConfig:
        moe_only = {
            "stabilizers.routing_replay": self.stabilizers.routing_replay != "none",
            "stabilizers.aux_loss_coef": self.stabilizers.aux_loss_coef > 0,
            "stabilizers.z_loss_coef": self.stabilizers.z_loss_coef > 0,
            "stabilizers.router_kl_coef": self.stabilizers.router_kl_coef > 0,
            "stabilizers.aux_free_bias": self.stabilizers.aux_free_bias,
            "stabilizers.noisy_gating": self.stabilizers.noisy_gating,
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
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def hash(self, *sections: str) -> str:
        """Stable short hash of the given sections (all when none): keys caches."""
        data = self.to_dict()
        if sections:
            data = {name: data[name] for name in sections}
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- errors
class ConfigError(ValueError):
    """A config failed validation; ``errors`` maps dotted field paths to messages."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{path}: {msg}" if path else msg for path, msg in errors))

    def as_dict(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for path, msg in self.errors:
            out.setdefault(path or "__all__", []).append(msg)
        return out


_FIELD_PREFIX = re.compile(r"^([a-z_][a-z0-9_.]*): ")


def _errors_from_pydantic(exc: ValidationError) -> list[tuple[str, str]]:
    errors = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling against `python -m trainer schema`"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
            # Model validators name their field as "field: message" (see _check_*).
            match = _FIELD_PREFIX.match(msg)
            if match:
                path = ".".join(p for p in (path, match.group(1)) if p)
                msg = msg[match.end() :]
        errors.append((path, msg))
    return errors


# --------------------------------------------------------------------------- API
def validate_config(data: dict[str, Any]) -> ExperimentConfig:
    """Validate a (possibly partial) nested dict; raise ConfigError naming fields.

    Checks types, ranges and cross-field rules, then that the task's prompts
    and responses fit ``rollout.max_new_tokens`` and ``model.max_seq_len``.
    """
    if not isinstance(data, dict):
        raise ConfigError([("", "the config must be a JSON object")])
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_errors_from_pydantic(exc)) from None
    # Lengths depend on the task's formats, so they are checked against the task itself.
    from trainer.tasks.factory import check_lengths

    errors = check_lengths(cfg)
    if errors:
        raise ConfigError(errors)
    return cfg


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
        raise ConfigError([(item, "an override must look like section.field=value")])
    path, raw = item.split("=", 1)
    keys = [k for k in path.strip().split(".") if k]
    if not keys:
        raise ConfigError([(item, "an override needs a field path before '='")])
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
                raise ConfigError([(".".join(keys), f"'{key}' is not a section")])
            node = child
        node[keys[-1]] = value
    return out


def json_schema() -> dict[str, Any]:
    """JSON Schema of the full config (served by the API, shown by the CLI)."""
    return ExperimentConfig.model_json_schema()
