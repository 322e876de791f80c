"""Hugging Face ``config.json`` <-> ``ModelConfig`` for the supported families.

``model_fields_from_hf`` maps a checkpoint's config to the ModelConfig shape
fields; every field of these families that the lab's model does not
implement (rope scaling, sliding windows, qkv clipping, router jitter,
quantisation, ...) is a ``FieldError`` naming that field, so an import is
either exactly the checkpoint's model or refused, never silently different.
``hf_config_from_model`` is the inverse, used by the exporter.

Families (``model_type``): qwen3_moe, qwen2_moe, olmoe, mixtral (MoE) and
qwen3, qwen2, llama (dense baselines of the same families).
"""

from __future__ import annotations

from typing import Any

from trainer.config import ModelConfig
from trainer.errors import FieldError

MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral")
DENSE_FAMILIES = ("qwen3", "qwen2", "llama")
FAMILIES = MOE_FAMILIES + DENSE_FAMILIES

ARCHITECTURES = {
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
}

# ModelConfig fields a checkpoint's config.json decides (the model's shape and math).
SHAPE_FIELDS = (
    "family",
    "vocab_size",
    "n_layers",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "n_experts",
    "top_k",
    "expert_hidden",
    "dense_hidden",
    "shared_expert_hidden",
    "shared_expert_gate",
    "dense_layers",
    "norm_topk_prob",
    "qk_norm",
    "attention_bias",
    "rope_theta",
    "norm_eps",
    "tie_embeddings",
    "positional",
)

SOURCE = "model.source"


def _unsupported(field: str, value: Any, why: str) -> tuple[str, str]:
    return (SOURCE, f"config.json field {field}={value!r} is not supported: {why}")


def _require(hf: dict[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise FieldError([(SOURCE, f"config.json has no {key!r}, which this family needs")])
    return hf[key]


def rope_theta_of(hf: dict[str, Any]) -> float:
    """The rotary base from ``rope_parameters`` (transformers 5) or ``rope_theta``
    (+ ``rope_scaling``, transformers 4); any scaling kind but plain RoPE is an error."""
    params = hf.get("rope_parameters")
    scaling = hf.get("rope_scaling")
    errors = []
    if isinstance(params, dict):
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            errors.append(
                _unsupported(
                    "rope_parameters.rope_type",
                    kind,
                    "only plain rotary embeddings ('default') are implemented",
                )
            )
        theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    else:
        theta = hf.get("rope_theta", 10000.0)
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        if kind != "default":
            errors.append(
                _unsupported(
                    "rope_scaling", scaling, "only plain rotary embeddings are implemented"
                )
            )
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        errors.append(
            _unsupported(
                "partial_rotary_factor", hf["partial_rotary_factor"], "rotary covers every dim"
            )
        )
    if errors:
        raise FieldError(errors)
    return float(theta)


def _check_common(hf: dict[str, Any], family: str) -> list[tuple[str, str]]:
    errors = []
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        errors.append(_unsupported("hidden_act", act, "the FFNs are SwiGLU (silu)"))
    if hf.get("attention_dropout", 0.0):
        errors.append(
            _unsupported("attention_dropout", hf["attention_dropout"], "training uses no dropout")
        )
    if hf.get("quantization_config") is not None:
        errors.append(
            _unsupported(
                "quantization_config",
                hf["quantization_config"].get("quant_method", "?"),
                "load an unquantised (bf16/fp16/fp32) checkpoint",
            )
        )
    if hf.get("use_sliding_window"):
        errors.append(
            _unsupported("use_sliding_window", True, "sliding-window attention is not implemented")
        )
    if family in ("mixtral", "llama") and hf.get("sliding_window") is not None:
        errors.append(
            _unsupported(
                "sliding_window",
                hf["sliding_window"],
                "sliding-window attention is not implemented (set it to null for full "
                "attention only if the model was trained that way)",
            )
        )
    layer_types = hf.get("layer_types") or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        errors.append(_unsupported("layer_types", other, "every layer uses full attention"))
    if hf.get("clip_qkv") is not None:
        errors.append(_unsupported("clip_qkv", hf["clip_qkv"], "q/k/v clipping is not implemented"))
    if hf.get("router_jitter_noise", 0.0):
        errors.append(
            _unsupported(
                "router_jitter_noise",
                hf["router_jitter_noise"],
                "set it to 0 (use stabilizers.noisy_gating for router noise)",
            )
        )
    if hf.get("mlp_bias"):
        errors.append(_unsupported("mlp_bias", True, "the FFNs have no biases"))
    return errors


def _dense_layers(hf: dict[str, Any], n_layers: int) -> list[int]:
    """Qwen-MoE rule: block i is sparse iff i not in mlp_only_layers and
    (i + 1) % decoder_sparse_step == 0."""
    only = set(hf.get("mlp_only_layers") or [])
    step = int(hf.get("decoder_sparse_step", 1) or 1)
    return [i for i in range(n_layers) if i in only or (i + 1) % step]


def model_fields_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig shape fields (``SHAPE_FIELDS``) for a checkpoint's config.json."""
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise FieldError(
            [
                (
                    SOURCE,
                    f"config.json model_type {family!r} is not supported; supported: "
                    + ", ".join(FAMILIES),
                )
            ]
        )
    errors = _check_common(hf, family)
    if errors:
        raise FieldError(errors)
    n_layers = int(_require(hf, "num_hidden_layers"))
    n_heads = int(_require(hf, "num_attention_heads"))
    fields: dict[str, Any] = {
        "family": family,
        "vocab_size": int(_require(hf, "vocab_size")),
        "n_layers": n_layers,
        "d_model": int(_require(hf, "hidden_size")),
        "n_heads": n_heads,
        "n_kv_heads": int(hf.get("num_key_value_heads") or n_heads),
        "head_dim": int(hf["head_dim"]) if hf.get("head_dim") else None,
        "rope_theta": rope_theta_of(hf),
        "norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "positional": "rope",
        "qk_norm": {"qwen3_moe": "head", "qwen3": "head", "olmoe": "full"}.get(family, "none"),
        "attention_bias": "none",
        "shared_expert_hidden": 0,
        "shared_expert_gate": False,
        "dense_layers": [],
        "norm_topk_prob": True,
        "dense_hidden": None,
        "n_experts": 0,
        "top_k": 2,
        "expert_hidden": ModelConfig().expert_hidden,
    }
    if family in ("qwen2", "qwen2_moe"):
        # Qwen2 always has q/k/v biases (transformers 5 spells the switch qkv_bias).
        fields["attention_bias"] = "qkv" if hf.get("qkv_bias", True) else "none"
    elif hf.get("attention_bias"):
        fields["attention_bias"] = "qkvo"
    if family in DENSE_FAMILIES:
        fields["dense_hidden"] = int(_require(hf, "intermediate_size"))
        return fields

    # transformers 5 writes num_local_experts for every family, 4 num_experts (not Mixtral).
    n_experts = hf.get("num_experts") or hf.get("num_local_experts")
    fields["n_experts"] = int(n_experts or 0)
    if not fields["n_experts"]:
        raise FieldError([(SOURCE, "config.json declares no experts (num_experts is 0)")])
    fields["top_k"] = int(_require(hf, "num_experts_per_tok"))
    if family in ("qwen3_moe", "qwen2_moe"):
        fields["expert_hidden"] = int(_require(hf, "moe_intermediate_size"))
        fields["dense_layers"] = _dense_layers(hf, n_layers)
        if fields["dense_layers"]:
            fields["dense_hidden"] = int(_require(hf, "intermediate_size"))
    else:
        fields["expert_hidden"] = int(_require(hf, "intermediate_size"))
    # norm_topk_prob defaults: transformers' Qwen2-MoE/OLMoE/Qwen3-MoE configs
    # default to False; Mixtral always renormalises.
    fields["norm_topk_prob"] = (
        True if family == "mixtral" else bool(hf.get("norm_topk_prob", False))
    )
    if family == "qwen2_moe":
        shared = int(hf.get("shared_expert_intermediate_size") or 0)
        fields["shared_expert_hidden"] = shared
        fields["shared_expert_gate"] = shared > 0
    return fields


# What each family's architecture can express: q/k norm kinds, attention-bias
# kinds, MoE or dense, whether a (gated) shared expert and dense blocks exist,
# whether the top-k gates are renormalised.
_EXPRESSIBLE: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"qk_norm": {"head"}, "bias": {"none", "qkvo"}, "moe": True, "shared": False, "dense_layers": True},
    "qwen2_moe": {"qk_norm": {"none"}, "bias": {"none", "qkv"}, "moe": True, "shared": True, "dense_layers": True},
    "olmoe": {"qk_norm": {"full"}, "bias": {"none", "qkvo"}, "moe": True, "shared": False, "dense_layers": False},
    "mixtral": {"qk_norm": {"none"}, "bias": {"none"}, "moe": True, "shared": False, "dense_layers": False, "norm_topk_prob": True},
    "qwen3": {"qk_norm": {"head"}, "bias": {"none", "qkvo"}, "moe": False},
    "qwen2": {"qk_norm": {"none"}, "bias": {"none", "qkv"}, "moe": False},
    "llama": {"qk_norm": {"none"}, "bias": {"none", "qkvo"}, "moe": False},
}  # fmt: skip


def inexpressible(cfg: ModelConfig, family: str) -> list[str]:
    """What in ``cfg`` the HF ``family`` cannot express (empty = exportable as it)."""
    rules = _EXPRESSIBLE[family]
    problems = []
    if cfg.positional != "rope":
        problems.append("learned positions (use positional=rope)")
    if cfg.qk_norm not in rules["qk_norm"]:
        problems.append(f"qk_norm={cfg.qk_norm} (it has {'/'.join(sorted(rules['qk_norm']))})")
    if cfg.attention_bias not in rules["bias"]:
        problems.append(f"attention_bias={cfg.attention_bias}")
    if cfg.is_moe != rules["moe"]:
        problems.append("an MoE model" if cfg.is_moe else "a dense model")
    if not (cfg.is_moe and rules["moe"]):
        return problems
    if rules["shared"]:
        if not (cfg.shared_expert_hidden and cfg.shared_expert_gate):
            problems.append("no sigmoid-gated shared expert (it always has one)")
    elif cfg.shared_expert_hidden:
        problems.append("a shared expert")
    if cfg.dense_layers and not rules["dense_layers"]:
        problems.append("dense blocks in an MoE model")
    if rules.get("norm_topk_prob") and not cfg.norm_topk_prob:
        problems.append("norm_topk_prob=false (it renormalises)")
    return problems


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
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "tie_word_embeddings": cfg.tie_embeddings,
            "attention_dropout": 0.0,
            "max_position_embeddings": max(
                int(out.get("max_position_embeddings") or 0), cfg.max_seq_len
            ),
            "torch_dtype": "float32",
        }
    )
    if family in ("qwen2", "qwen2_moe"):
        out["qkv_bias"] = cfg.attention_bias != "none"
    else:
        out["attention_bias"] = cfg.attention_bias == "qkvo"
    if family in DENSE_FAMILIES:
        out["intermediate_size"] = cfg.resolved_dense_hidden
        return out
    out["num_experts_per_tok"] = cfg.top_k
    if family == "mixtral":
        out.update(
            num_local_experts=cfg.n_experts,
            intermediate_size=cfg.expert_hidden,
            sliding_window=None,
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
