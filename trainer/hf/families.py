"""The supported Hugging Face families, and a checkpoint's ``config.json`` read
into ``ModelConfig`` fields.

``model_fields_from_hf`` maps a checkpoint's config to the ModelConfig shape
fields; every field of these families that the lab's model does not
implement (rope scaling, sliding windows, qkv clipping, router jitter,
quantisation, ...) is a ``FieldError`` naming that field, so an import is
either exactly the checkpoint's model or refused, never silently different.
The inverse (a lab model written as a config.json for export) is
``trainer.hf.export_config``; the family tables both directions read
(``FAMILIES``, ``ARCHITECTURES``, ``EXPRESSIBLE``) are here, the config classes'
defaults in ``trainer.hf.family_defaults``.

Families (``model_type``): qwen3_moe, qwen2_moe, olmoe, mixtral, deepseek_v3,
deepseek_v2, glm4_moe, gpt_oss (MoE; the last four in ``trainer.hf.families_routed``)
and qwen3, qwen2, llama (dense baselines).
"""

from __future__ import annotations

from typing import Any

from trainer.config import ModelConfig
from trainer.errors import FieldError
from trainer.hf.config_fields import (
    SCALED_ROPE_KINDS,
    SOURCE,
    require,
    rope_fields_of,
    rope_theta_of,
    unsupported,
)
from trainer.hf.family_defaults import FAMILY_DEFAULTS, with_family_defaults

__all__ = [
    "ARCHITECTURES",
    "DENSE_FAMILIES",
    "EXPRESSIBLE",
    "FAMILIES",
    "FAMILY_DEFAULTS",
    "MOE_FAMILIES",
    "SCALED_ROPE_KINDS",
    "SHAPE_FIELDS",
    "SOURCE",
    "model_fields_from_hf",
    "rope_fields_of",
    "rope_theta_of",
    "sliding_fields_of",
    "with_family_defaults",
]
from trainer.hf.families_routed import LATENT_FAMILIES, ROUTED_FAMILIES, routed_family_fields

MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral", *ROUTED_FAMILIES)
DENSE_FAMILIES = ("qwen3", "qwen2", "llama")
FAMILIES = MOE_FAMILIES + DENSE_FAMILIES

ARCHITECTURES = {
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
}

# What each family's architecture can express: q/k norm kinds, attention-bias
# kinds, MoE or dense, its shared expert (False: none; True: one with a sigmoid gate;
# "ungated": n_shared_experts of the expert width), its dense blocks (False, True: any,
# "prefix": the first k), a fixed norm_topk_prob, and the features of
# trainer.config.model_parts: "mla", "sinks", "partial_rotary", the router
# ("router": score, logit bias, group score or None) and "expert_ffn" ("gpt_oss": biases
# and the clamped SwiGLU). A key left out means the builtin default only.
EXPRESSIBLE: dict[str, dict[str, Any]] = {
    "deepseek_v3": {
        "qk_norm": {"none"},
        "bias": {"none"},
        "moe": True,
        "shared": "ungated",
        "dense_layers": "prefix",
        "mla": True,
        "router": ("sigmoid", False, "top2_sum"),
    },
    "deepseek_v2": {
        "qk_norm": {"none"},
        "bias": {"none"},
        "moe": True,
        "shared": "ungated",
        "dense_layers": "prefix",
        "mla": True,
        "router": ("softmax", False, "max"),
        "norm_topk_prob": False,
    },
    "glm4_moe": {
        "qk_norm": {"none", "head"},
        "bias": {"none", "qkv"},
        "moe": True,
        "shared": "ungated",
        "dense_layers": "prefix",
        "partial_rotary": True,
        "router": ("sigmoid", False, "top2_sum"),
    },
    "gpt_oss": {
        "qk_norm": {"none"},
        "bias": {"none", "qkvo"},
        "moe": True,
        "shared": False,
        "dense_layers": False,
        "sinks": True,
        "router": ("softmax", True, None),
        "expert_ffn": "gpt_oss",
        "norm_topk_prob": True,
    },
    "qwen3_moe": {
        "qk_norm": {"head"},
        "bias": {"none", "qkvo"},
        "moe": True,
        "shared": False,
        "dense_layers": True,
    },
    "qwen2_moe": {
        "qk_norm": {"none"},
        "bias": {"none", "qkv"},
        "moe": True,
        "shared": True,
        "dense_layers": True,
    },
    "olmoe": {
        "qk_norm": {"full"},
        "bias": {"none", "qkvo"},
        "moe": True,
        "shared": False,
        "dense_layers": False,
    },
    "mixtral": {
        "qk_norm": {"none"},
        "bias": {"none"},
        "moe": True,
        "shared": False,
        "dense_layers": False,
        "norm_topk_prob": True,
    },
    "qwen3": {"qk_norm": {"head"}, "bias": {"none", "qkvo"}, "moe": False},
    "qwen2": {"qk_norm": {"none"}, "bias": {"none", "qkv"}, "moe": False},
    "llama": {"qk_norm": {"none"}, "bias": {"none", "qkvo"}, "moe": False},
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
    "rope_scaling",
    "sliding_window",
    "sliding_layers",
    "norm_eps",
    "tie_embeddings",
    "positional",
    "rotary_fraction",
    "attention_sinks",
    "mla",
    "router",
    "expert_ffn",
)


def sliding_fields_of(hf: dict[str, Any], family: str, n_layers: int) -> dict[str, Any]:
    """``sliding_window`` / ``sliding_layers`` as each family's transformers model
    applies them: Mixtral and Qwen3-MoE window every layer when ``sliding_window``
    (Qwen3-MoE: and ``use_sliding_window``) is set; Qwen2/Qwen3 window the layers
    from ``max_window_layers`` on, Qwen2-MoE the even-numbered ones below it,
    unless ``layer_types`` names them."""
    none = {"sliding_window": None, "sliding_layers": None}
    if family == "mixtral":
        window = hf.get("sliding_window")
        return none if window is None else {"sliding_window": int(window), "sliding_layers": None}
    if family == "qwen3_moe":
        if not hf.get("use_sliding_window") or hf.get("sliding_window") is None:
            return none
        return {"sliding_window": int(hf["sliding_window"]), "sliding_layers": None}
    if family not in ("qwen2", "qwen3", "qwen2_moe"):
        return none
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    layer_types = hf.get("layer_types")
    if layer_types is None:
        top = int(hf.get("max_window_layers") or 0)
        if window is None:
            layer_types = ["full_attention"] * n_layers
        elif family == "qwen2_moe":
            layer_types = [
                "sliding_attention" if (i + 1) % 2 and i < top else "full_attention"
                for i in range(n_layers)
            ]
        else:
            layer_types = [
                "sliding_attention" if i >= top else "full_attention" for i in range(n_layers)
            ]
    layers = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    if not layers or not window:
        return none
    return {"sliding_window": int(window), "sliding_layers": layers}


def _check_common(hf: dict[str, Any], family: str) -> list[tuple[str, str]]:
    errors = []
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        errors.append(unsupported("hidden_act", act, "the FFNs are SwiGLU (silu)"))
    if hf.get("attention_dropout", 0.0):
        errors.append(
            unsupported("attention_dropout", hf["attention_dropout"], "training uses no dropout")
        )
    if hf.get("quantization_config") is not None:
        errors.append(
            unsupported(
                "quantization_config",
                hf["quantization_config"].get("quant_method", "?"),
                "load an unquantised (bf16/fp16/fp32) checkpoint",
            )
        )
    windowed = ("mixtral", "qwen3_moe", "qwen2_moe", "qwen2", "qwen3", "gpt_oss")
    if family not in windowed and hf.get("use_sliding_window"):
        errors.append(
            unsupported("use_sliding_window", True, f"{family} has no sliding-window attention")
        )
    if family == "llama" and hf.get("sliding_window") is not None:
        errors.append(
            unsupported(
                "sliding_window",
                hf["sliding_window"],
                "transformers' llama ignores it; set it to null if the model was trained "
                "with full attention",
            )
        )
    layer_types = hf.get("layer_types") or []
    allowed = {"full_attention"}
    if family in ("qwen2", "qwen3", "qwen2_moe", "gpt_oss"):
        allowed.add("sliding_attention")
    other = sorted({t for t in layer_types if t not in allowed})
    if other:
        errors.append(unsupported("layer_types", other, f"{family} layers: {sorted(allowed)}"))
    if hf.get("clip_qkv") is not None:
        errors.append(unsupported("clip_qkv", hf["clip_qkv"], "q/k/v clipping is not implemented"))
    if hf.get("router_jitter_noise", 0.0):
        errors.append(
            unsupported(
                "router_jitter_noise",
                hf["router_jitter_noise"],
                "set it to 0 (use stabilizers.noisy_gating for router noise)",
            )
        )
    if hf.get("mlp_bias"):
        errors.append(unsupported("mlp_bias", True, "the FFNs have no biases"))
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
    hf = with_family_defaults(hf)
    errors = _check_common(hf, family)
    if errors:
        raise FieldError(errors)
    n_layers = int(require(hf, "num_hidden_layers"))
    n_heads = int(require(hf, "num_attention_heads"))
    theta, scaling = rope_fields_of(
        hf, partial_rotary=family == "glm4_moe", latent=family in LATENT_FAMILIES
    )
    fields: dict[str, Any] = {
        "family": family,
        "vocab_size": int(require(hf, "vocab_size")),
        "n_layers": n_layers,
        "d_model": int(require(hf, "hidden_size")),
        "n_heads": n_heads,
        "n_kv_heads": int(hf.get("num_key_value_heads") or n_heads),
        "head_dim": int(hf["head_dim"]) if hf.get("head_dim") else None,
        "rope_theta": theta,
        "rope_scaling": scaling,
        **sliding_fields_of(hf, family, n_layers),
        "norm_eps": float(require(hf, "rms_norm_eps")),
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
        "rotary_fraction": 1.0,
        "attention_sinks": False,
        "mla": {},
        "router": {},
        "expert_ffn": {},
    }
    if family in ("qwen2", "qwen2_moe"):
        # Qwen2 always has q/k/v biases (transformers 5 spells the switch qkv_bias).
        fields["attention_bias"] = "qkv" if hf.get("qkv_bias", True) else "none"
    elif hf.get("attention_bias"):
        fields["attention_bias"] = "qkvo"
    if family in DENSE_FAMILIES:
        fields["dense_hidden"] = int(require(hf, "intermediate_size"))
        return fields
    if family in ROUTED_FAMILIES:
        routed_family_fields(hf, family, fields)
        return fields

    # transformers 5 writes num_local_experts for every family, 4 num_experts (not Mixtral).
    n_experts = hf.get("num_experts") or hf.get("num_local_experts")
    fields["n_experts"] = int(n_experts or 0)
    if not fields["n_experts"]:
        raise FieldError([(SOURCE, "config.json declares no experts (num_experts is 0)")])
    fields["top_k"] = int(require(hf, "num_experts_per_tok"))
    if family in ("qwen3_moe", "qwen2_moe"):
        fields["expert_hidden"] = int(require(hf, "moe_intermediate_size"))
        fields["dense_layers"] = _dense_layers(hf, n_layers)
        if fields["dense_layers"]:
            fields["dense_hidden"] = int(require(hf, "intermediate_size"))
    else:
        fields["expert_hidden"] = int(require(hf, "intermediate_size"))
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
