"""A lab model written out as a Hugging Face ``config.json``, for the exporter
(trainer/hf/export.py): which family it is written as (``export_family``),
what that family cannot express (``inexpressible``, refused rather than
changed), and the config itself (``hf_config_from_model``), the inverse of
``trainer.hf.families.model_fields_from_hf``. Torch-free.
"""

from __future__ import annotations

from typing import Any

from trainer.config import ModelConfig
from trainer.errors import FieldError
from trainer.hf.export_routed import feature_problems, routed_config
from trainer.hf.families import ARCHITECTURES, DENSE_FAMILIES, EXPRESSIBLE
from trainer.hf.families_routed import ROUTED_FAMILIES


def inexpressible(cfg: ModelConfig, family: str) -> list[str]:
    """What in ``cfg`` the HF ``family`` cannot express (empty = exportable as it)."""
    rules = EXPRESSIBLE[family]
    problems = []
    if cfg.positional != "rope":
        problems.append("learned positions (use positional=rope)")
    if cfg.qk_norm not in rules["qk_norm"]:
        problems.append(f"qk_norm={cfg.qk_norm} (it has {'/'.join(sorted(rules['qk_norm']))})")
    if cfg.attention_bias not in rules["bias"]:
        problems.append(f"attention_bias={cfg.attention_bias}")
    problems += _sliding_problems(cfg, family)
    if cfg.is_moe != rules["moe"]:
        problems.append("an MoE model" if cfg.is_moe else "a dense model")
    problems += feature_problems(cfg, family, rules)
    if not (cfg.is_moe and rules["moe"]):
        return problems
    if rules["shared"] is True:
        if not (cfg.shared_expert_hidden and cfg.shared_expert_gate):
            problems.append("no sigmoid-gated shared expert (it always has one)")
    elif not rules["shared"] and cfg.shared_expert_hidden:
        problems.append("a shared expert")
    if cfg.dense_layers and not rules["dense_layers"]:
        problems.append("dense blocks in an MoE model")
    fixed = rules.get("norm_topk_prob")
    if fixed is not None and cfg.norm_topk_prob != fixed:
        problems.append(
            "norm_topk_prob=false (it renormalises)"
            if fixed
            else "norm_topk_prob=true (it never renormalises)"
        )
    return problems


def _sliding_problems(cfg: ModelConfig, family: str) -> list[str]:
    if cfg.sliding_window is None:
        return []
    if family in ("olmoe", "llama", "deepseek_v3", "deepseek_v2", "glm4_moe"):
        return ["sliding-window attention"]
    every = cfg.sliding_layers is None or sorted(cfg.sliding_layers) == list(range(cfg.n_layers))
    if family in ("mixtral", "qwen3_moe") and not every:
        return ["sliding-window attention in some blocks only (it windows every block)"]
    return []


def rope_parameters_of(cfg: ModelConfig) -> dict[str, Any]:
    """transformers 5's ``rope_parameters`` for ``cfg`` (inverse of
    ``trainer.hf.families.rope_fields_of``)."""
    scaling = cfg.rope_scaling
    out: dict[str, Any] = {"rope_type": scaling.kind, "rope_theta": cfg.rope_theta}
    if cfg.rotary_fraction != 1.0:
        out["partial_rotary_factor"] = cfg.rotary_fraction
    if scaling.kind == "default":
        return out
    out["factor"] = scaling.factor
    if scaling.kind == "llama3":
        out.update(
            original_max_position_embeddings=scaling.max_positions,
            low_freq_factor=scaling.low_freq_factor,
            high_freq_factor=scaling.high_freq_factor,
        )
    elif scaling.kind == "yarn":
        out.update(
            original_max_position_embeddings=scaling.max_positions,
            beta_fast=scaling.beta_fast,
            beta_slow=scaling.beta_slow,
            truncate=scaling.truncate,
        )
        if scaling.attention_factor is not None:
            out["attention_factor"] = scaling.attention_factor
        if scaling.mscale_all_dim is not None:
            out["mscale_all_dim"] = scaling.mscale_all_dim
    return out


def _sliding_config(cfg: ModelConfig, family: str) -> dict[str, Any]:
    window = cfg.sliding_window
    if family in ROUTED_FAMILIES:  # GPT-OSS's layer_types: trainer.hf.export_routed
        return {}
    if family == "mixtral":
        return {"sliding_window": window}
    if family in ("olmoe", "llama"):
        return {}
    out: dict[str, Any] = {"use_sliding_window": window is not None, "sliding_window": window}
    if family in ("qwen2", "qwen3", "qwen2_moe"):
        out["layer_types"] = [
            "sliding_attention" if cfg.uses_sliding_window(i) else "full_attention"
            for i in range(cfg.n_layers)
        ]
        out["max_window_layers"] = cfg.n_layers
    return out


def export_family(cfg: ModelConfig) -> str:
    """The HF family a trained model is written as: ``cfg.family``, or for a
    builtin model the family with the same math (mixtral for MoE, llama for
    dense). A model the family cannot express exactly is refused."""
    family = cfg.family
    if family == "builtin":
        family = "mixtral" if cfg.is_moe else "llama"
    problems = inexpressible(cfg, family)
    if problems:
        raise FieldError(
            [
                (
                    "model.family",
                    f"this model cannot be written as {family} without changing it: "
                    + "; ".join(problems),
                )
            ]
        )
    return family


def _max_positions(cfg: ModelConfig, base: dict[str, Any]) -> int:
    """The context the exported config declares: the source checkpoint's (dynamic
    NTK scaling starts from it), else for a builtin model the run's max_seq_len."""
    if base.get("max_position_embeddings"):
        return int(base["max_position_embeddings"])
    if cfg.rope_scaling.kind == "dynamic":
        return int(cfg.rope_scaling.max_positions)
    return cfg.max_seq_len


def hf_config_from_model(
    cfg: ModelConfig, vocab_size: int, base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """config.json for ``cfg`` in its export family. ``base`` (the source
    checkpoint's config.json) keeps its other keys (token ids, ...)."""
    family = export_family(cfg)
    out = dict(base or {})
    for stale in ("rope_scaling", "transformers_version", "torch_dtype", "dtype"):
        out.pop(stale, None)
    n_kv = cfg.resolved_n_kv_heads
    out.update(
        {
            "architectures": [ARCHITECTURES[family]],
            "model_type": family,
            "vocab_size": vocab_size,
            "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": n_kv,
            "head_dim": cfg.resolved_head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta,
            "rope_parameters": rope_parameters_of(cfg),
            "tie_word_embeddings": cfg.tie_embeddings,
            "attention_dropout": 0.0,
            "max_position_embeddings": _max_positions(cfg, out),
            "torch_dtype": "float32",
        }
    )
    for stale in ("use_sliding_window", "sliding_window", "layer_types", "max_window_layers"):
        out.pop(stale, None)
    out.update(_sliding_config(cfg, family))
    if family in ("qwen2", "qwen2_moe"):
        out["qkv_bias"] = cfg.attention_bias != "none"
    else:
        out["attention_bias"] = cfg.attention_bias == "qkvo"
    if family in DENSE_FAMILIES:
        out["intermediate_size"] = cfg.resolved_dense_hidden
        return out
    if family in ROUTED_FAMILIES:
        out.update(routed_config(cfg, family))
        return out
    out["num_experts_per_tok"] = cfg.top_k
    if family == "mixtral":
        out.update(
            num_local_experts=cfg.n_experts,
            intermediate_size=cfg.expert_hidden,
            router_jitter_noise=0.0,
        )
        return out
    out["num_experts"] = cfg.n_experts
    out["norm_topk_prob"] = cfg.norm_topk_prob
    if family == "olmoe":
        out.update(intermediate_size=cfg.expert_hidden, clip_qkv=None)
        return out
    out.update(
        moe_intermediate_size=cfg.expert_hidden,
        mlp_only_layers=list(cfg.dense_layers),
        decoder_sparse_step=1,
    )
    if cfg.dense_layers or "intermediate_size" not in out:
        out["intermediate_size"] = cfg.resolved_dense_hidden
    if family == "qwen2_moe":
        out["shared_expert_intermediate_size"] = cfg.shared_expert_hidden
    return out
