"""The supported Hugging Face families, and a checkpoint's ``config.json`` read
into ``ModelConfig`` fields.

``model_fields_from_hf`` maps a checkpoint's config to the ModelConfig shape
fields; every field of these families that the lab's model does not
implement (rope scaling, sliding windows, qkv clipping, router jitter,
quantisation, ...) is a ``FieldError`` naming that field, so an import is
either exactly the checkpoint's model or refused, never silently different.
The inverse (a lab model written as a config.json for export) is
``trainer.hf.export_config``; the family tables both directions read
(``FAMILIES``, ``ARCHITECTURES``, ``EXPRESSIBLE``, ``FAMILY_DEFAULTS``) are here.

Families (``model_type``): qwen3_moe, qwen2_moe, olmoe, mixtral (MoE) and
qwen3, qwen2, llama (dense baselines of the same families).
"""

from __future__ import annotations

import math
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

# What each family's architecture can express: q/k norm kinds, attention-bias
# kinds, MoE or dense, whether a (gated) shared expert and dense blocks exist,
# whether the top-k gates are renormalised.
EXPRESSIBLE: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"qk_norm": {"head"}, "bias": {"none", "qkvo"}, "moe": True, "shared": False, "dense_layers": True},
    "qwen2_moe": {"qk_norm": {"none"}, "bias": {"none", "qkv"}, "moe": True, "shared": True, "dense_layers": True},
    "olmoe": {"qk_norm": {"full"}, "bias": {"none", "qkvo"}, "moe": True, "shared": False, "dense_layers": False},
    "mixtral": {"qk_norm": {"none"}, "bias": {"none"}, "moe": True, "shared": False, "dense_layers": False, "norm_topk_prob": True},
    "qwen3": {"qk_norm": {"head"}, "bias": {"none", "qkvo"}, "moe": False},
    "qwen2": {"qk_norm": {"none"}, "bias": {"none", "qkv"}, "moe": False},
    "llama": {"qk_norm": {"none"}, "bias": {"none", "qkvo"}, "moe": False},
}  # fmt: skip

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
)

SOURCE = "model.source"


def _unsupported(field: str, value: Any, why: str) -> tuple[str, str]:
    return (SOURCE, f"config.json field {field}={value!r} is not supported: {why}")


def _require(hf: dict[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise FieldError([(SOURCE, f"config.json has no {key!r}, which this family needs")])
    return hf[key]


# Each family's config-class defaults (transformers 5's ``XConfig()``), for the
# config.json keys the mapping reads: a checkpoint that omits a key gets what
# transformers would give it (tested against the classes in
# tests/trainer/test_hf_families.py). ``None`` = derived (kv heads = heads,
# head_dim = hidden / heads).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {
        "vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 24,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": None,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "norm_topk_prob": False, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "rope_theta": 10000.0, "max_position_embeddings": 32768,
        "attention_bias": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "use_sliding_window": False, "sliding_window": 4096,
    },
    "qwen2_moe": {
        "vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 24,
        "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
        "moe_intermediate_size": 1408, "num_experts": 60, "num_experts_per_tok": 4,
        "norm_topk_prob": False, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "rope_theta": 10000.0, "max_position_embeddings": 32768, "qkv_bias": True,
        "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "use_sliding_window": False, "sliding_window": 4096,
        "max_window_layers": 28,
    },
    "olmoe": {
        "vocab_size": 50304, "hidden_size": 2048, "num_hidden_layers": 16,
        "num_attention_heads": 16, "num_key_value_heads": None, "intermediate_size": 2048,
        "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "attention_bias": False,
    },
    "mixtral": {
        "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None,
        "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 1e6,
        "max_position_embeddings": 131072, "sliding_window": None,
    },
    "qwen3": {
        "vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
        "intermediate_size": 22016, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "rope_theta": 10000.0, "max_position_embeddings": 32768, "attention_bias": False,
        "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
    },
    "qwen2": {
        "vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 22016,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0,
        "max_position_embeddings": 32768, "use_sliding_window": False,
        "sliding_window": 4096, "max_window_layers": 28,
    },
    "llama": {
        "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None,
        "intermediate_size": 11008, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "rope_theta": 10000.0, "max_position_embeddings": 2048, "attention_bias": False,
    },
}  # fmt: skip


def with_family_defaults(hf: dict[str, Any]) -> dict[str, Any]:
    """``hf`` with every key its family's config class defaults filled in (a key
    present with null stays null only where the class keeps null)."""
    defaults = FAMILY_DEFAULTS.get(hf.get("model_type"), {})
    out = dict(hf)
    # transformers 5 spells the expert count num_local_experts in some families'
    # files and num_experts in others: either one present is the count.
    experts = {"num_experts", "num_local_experts"}
    for key, value in defaults.items():
        if key in experts and experts & set(out):
            continue
        if key not in out:
            out[key] = value
    return out


SCALED_ROPE_KINDS = ("linear", "dynamic", "yarn", "llama3")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN eq. 21: 0.1 * mscale * ln(scale) + 1 (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_fields_of(hf: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(rope_theta, rope_scaling fields) from ``rope_parameters`` (transformers 5) or
    ``rope_theta`` + ``rope_scaling`` (transformers 4), resolved as transformers'
    ``standardize_rope_params`` and ``ROPE_INIT_FUNCTIONS`` do; longrope, partial
    rotary and per-layer rope parameters are refused."""
    # transformers 5's convert_rope_params_to_dict: a rope_scaling dict wins over
    # rope_parameters; the base falls back to rope_theta, then the class default.
    params = hf.get("rope_scaling")
    if not isinstance(params, dict):
        params = hf.get("rope_parameters")
    params = dict(params) if isinstance(params, dict) else {}
    errors = []
    if any(isinstance(v, dict) for v in params.values()):
        errors.append(
            _unsupported("rope_parameters", params, "one rope for every layer is implemented")
        )
        raise FieldError(errors)
    kind = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    if kind not in ("default", *SCALED_ROPE_KINDS):
        errors.append(
            _unsupported(
                "rope_parameters.rope_type",
                kind,
                "implemented: default, " + ", ".join(SCALED_ROPE_KINDS),
            )
        )
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1.0):
        errors.append(_unsupported("partial_rotary_factor", partial, "rotary covers every dim"))
    if errors:
        raise FieldError(errors)
    scaling: dict[str, Any] = {"kind": kind}
    if kind == "default":
        return theta, scaling
    max_pos = hf.get("max_position_embeddings")
    original = hf.get("original_max_position_embeddings") or params.get(
        "original_max_position_embeddings", max_pos
    )
    factor = params.get("factor")
    if kind == "yarn" and factor is None and max_pos and original:
        factor = max_pos / original
    if factor is None:
        raise FieldError([(SOURCE, f"config.json rope scaling {kind!r} has no factor")])
    scaling["factor"] = float(factor)
    if kind == "dynamic":
        scaling["max_positions"] = max_pos
    elif kind == "llama3":
        scaling.update(
            max_positions=original,
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        )
    elif kind == "yarn":
        attention_factor = params.get("attention_factor")
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if attention_factor is None and mscale and mscale_all:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        scaling.update(
            max_positions=original,
            beta_fast=float(params.get("beta_fast") or 32),
            beta_slow=float(params.get("beta_slow") or 1),
            attention_factor=None if attention_factor is None else float(attention_factor),
            truncate=bool(params.get("truncate", True)),
        )
    if kind != "linear" and scaling.get("max_positions") is None:
        raise FieldError(
            [(SOURCE, f"config.json rope scaling {kind!r} needs max_position_embeddings")]
        )
    return theta, scaling


def rope_theta_of(hf: dict[str, Any]) -> float:
    """The rotary base (see ``rope_fields_of``)."""
    return rope_fields_of(hf)[0]


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
    windowed = ("mixtral", "qwen3_moe", "qwen2_moe", "qwen2", "qwen3")
    if family not in windowed and hf.get("use_sliding_window"):
        errors.append(
            _unsupported("use_sliding_window", True, f"{family} has no sliding-window attention")
        )
    if family == "llama" and hf.get("sliding_window") is not None:
        errors.append(
            _unsupported(
                "sliding_window",
                hf["sliding_window"],
                "transformers' llama ignores it; set it to null if the model was trained "
                "with full attention",
            )
        )
    layer_types = hf.get("layer_types") or []
    allowed = {"full_attention"}
    if family in ("qwen2", "qwen3", "qwen2_moe"):
        allowed.add("sliding_attention")
    other = sorted({t for t in layer_types if t not in allowed})
    if other:
        errors.append(_unsupported("layer_types", other, f"{family} layers: {sorted(allowed)}"))
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
    hf = with_family_defaults(hf)
    errors = _check_common(hf, family)
    if errors:
        raise FieldError(errors)
    n_layers = int(_require(hf, "num_hidden_layers"))
    n_heads = int(_require(hf, "num_attention_heads"))
    theta, scaling = rope_fields_of(hf)
    fields: dict[str, Any] = {
        "family": family,
        "vocab_size": int(_require(hf, "vocab_size")),
        "n_layers": n_layers,
        "d_model": int(_require(hf, "hidden_size")),
        "n_heads": n_heads,
        "n_kv_heads": int(hf.get("num_key_value_heads") or n_heads),
        "head_dim": int(hf["head_dim"]) if hf.get("head_dim") else None,
        "rope_theta": theta,
        "rope_scaling": scaling,
        **sliding_fields_of(hf, family, n_layers),
        "norm_eps": float(_require(hf, "rms_norm_eps")),
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
