"""config.json -> ``ModelConfig`` fields for the families whose routing goes beyond a
softmax top-k: DeepSeek-V3 (Kimi-K2, Moonlight), DeepSeek-V2, GLM-4.5 and GPT-OSS,
as transformers 5's classes build them (parity: tests/trainer/test_hf_routed_parity.py).

* ``deepseek_v3``: multi-head latent attention, sigmoid router with the correction bias
  (``e_score_correction_bias``: the selection bias), group-limited top-k (top-2-sum group
  scores), ``routed_scaling_factor``, ``n_shared_experts`` ungated shared experts, dense
  blocks before ``first_k_dense_replace``, yarn with ``mscale_all_dim``.
* ``deepseek_v2``: the same attention and blocks, a softmax router, greedy or
  group-limited (max group scores) top-k, gates never renormalised (transformers'
  DeepSeek-V2 ignores ``norm_topk_prob``; a true value is refused).
* ``glm4_moe``: grouped-query attention with partial rotary (``partial_rotary_factor``,
  default 0.5), optional per-head q/k norm (``use_qk_norm``), q/k/v biases, and
  DeepSeek-V3's router and shared experts.
* ``gpt_oss``: attention sinks, q/k/v/o biases, sliding/full layers (``layer_types``),
  a softmax router with a logit bias, experts with biases and the clamped SwiGLU.

``fields`` arrives holding the keys every family shares (``trainer.hf.families``) and
is completed here. Torch-free.
"""

from __future__ import annotations

from typing import Any

from trainer.errors import FieldError
from trainer.hf.config_fields import SOURCE, require, rotary_fraction_of, unsupported

LATENT_FAMILIES = ("deepseek_v3", "deepseek_v2")
ROUTED_FAMILIES = ("deepseek_v3", "deepseek_v2", "glm4_moe", "gpt_oss")
# Multi-token-prediction layers (``num_nextn_predict_layers``) sit after the last block
# in DeepSeek-V3 and GLM-4.5 checkpoints; transformers does not build them and ignores
# their tensors (``_keys_to_ignore_on_load_unexpected``), so the import does too.
MTP_FAMILIES = ("deepseek_v3", "glm4_moe")


def mtp_layers(hf: dict[str, Any]) -> int:
    """How many multi-token-prediction layers follow the blocks (0 outside MTP_FAMILIES)."""
    if hf.get("model_type") not in MTP_FAMILIES:
        return 0
    return int(hf.get("num_nextn_predict_layers") or 0)


def routed_family_fields(hf: dict[str, Any], family: str, fields: dict[str, Any]) -> None:
    """Complete ``fields`` (in place) for one of ``ROUTED_FAMILIES``."""
    if family == "gpt_oss":
        _gpt_oss(hf, fields)
        return
    n_layers = fields["n_layers"]
    if family in LATENT_FAMILIES:
        _latent_attention(hf, fields)
    else:
        _glm_attention(hf, fields)
    n_experts = int(require(hf, "n_routed_experts"))
    expert_hidden = int(require(hf, "moe_intermediate_size"))
    first_dense = int(hf.get("first_k_dense_replace") or 0)
    shared = int(hf.get("n_shared_experts") or 0)
    fields.update(
        n_experts=n_experts,
        top_k=int(require(hf, "num_experts_per_tok")),
        expert_hidden=expert_hidden,
        shared_expert_hidden=shared * expert_hidden,
        shared_expert_gate=False,
        dense_layers=list(range(min(first_dense, n_layers))),
    )
    if fields["dense_layers"]:
        fields["dense_hidden"] = int(require(hf, "intermediate_size"))
    scaling = float(hf.get("routed_scaling_factor") or 1.0)
    if family == "deepseek_v2":
        fields["router"] = _v2_router(hf, scaling)
        fields["norm_topk_prob"] = False
        return
    fields["norm_topk_prob"] = bool(hf.get("norm_topk_prob", True))
    n_group, topk_group = int(hf.get("n_group") or 1), int(hf.get("topk_group") or 1)
    fields["router"] = {
        "score": "sigmoid",
        "n_groups": n_group,
        "topk_groups": min(topk_group, n_group),
        "group_score": "top2_sum",
        "scaling": scaling,
    }


def _latent_attention(hf: dict[str, Any], fields: dict[str, Any]) -> None:
    n_heads = fields["n_heads"]
    kv_heads = hf.get("num_key_value_heads") or n_heads
    if int(kv_heads) != n_heads:
        raise FieldError(
            [unsupported("num_key_value_heads", kv_heads, "latent attention has one key per head")]
        )
    if hf.get("attention_bias"):
        raise FieldError(
            [unsupported("attention_bias", True, "latent attention projections have no biases")]
        )
    q_lora = hf.get("q_lora_rank")
    fields.update(
        n_kv_heads=None,
        head_dim=None,  # config.json's head_dim is the rope part; latent heads have their own
        mla={
            "enabled": True,
            "q_lora_rank": int(q_lora) if q_lora else None,
            "kv_lora_rank": int(require(hf, "kv_lora_rank")),
            "qk_nope_head_dim": int(require(hf, "qk_nope_head_dim")),
            "qk_rope_head_dim": int(require(hf, "qk_rope_head_dim")),
            "v_head_dim": int(require(hf, "v_head_dim")),
        },
    )


def _glm_attention(hf: dict[str, Any], fields: dict[str, Any]) -> None:
    fields.update(
        qk_norm="head" if hf.get("use_qk_norm") else "none",
        # GLM-4.5: attention_bias puts biases on q, k and v; o_proj never has one.
        attention_bias="qkv" if hf.get("attention_bias") else "none",
        rotary_fraction=rotary_fraction_of(hf),
    )


def _v2_router(hf: dict[str, Any], scaling: float) -> dict[str, Any]:
    if hf.get("norm_topk_prob"):
        raise FieldError(
            [
                unsupported(
                    "norm_topk_prob",
                    True,
                    "transformers' DeepSeek-V2 never renormalises the gates, and the lab "
                    "matches it; set it to false",
                )
            ]
        )
    method = hf.get("topk_method") or "greedy"
    router: dict[str, Any] = {"score": "softmax", "scaling": scaling}
    if method == "greedy":
        return router
    if method != "group_limited_greedy":
        raise FieldError(
            [unsupported("topk_method", method, "greedy or group_limited_greedy (DeepSeek-V2)")]
        )
    if not hf.get("n_group") or not hf.get("topk_group"):
        raise FieldError(
            [(SOURCE, "config.json topk_method group_limited_greedy needs n_group and topk_group")]
        )
    n_group = int(hf["n_group"])
    router.update(
        n_groups=n_group, topk_groups=min(int(hf["topk_group"]), n_group), group_score="max"
    )
    return router


def _gpt_oss(hf: dict[str, Any], fields: dict[str, Any]) -> None:
    n_layers = fields["n_layers"]
    layer_types = hf.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)
    ]
    if len(layer_types) != n_layers:
        raise FieldError(
            [(SOURCE, f"config.json layer_types names {len(layer_types)} of {n_layers} layers")]
        )
    sliding = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    window = hf.get("sliding_window")
    fields.update(
        attention_bias="qkvo" if hf.get("attention_bias", True) else "none",
        attention_sinks=True,
        sliding_window=int(window) if sliding and window else None,
        sliding_layers=sliding if sliding and window else None,
        n_experts=int(require(hf, "num_local_experts")),
        top_k=int(require(hf, "num_experts_per_tok")),
        expert_hidden=int(require(hf, "intermediate_size")),
        norm_topk_prob=True,  # softmax over the top-k logits = renormalised softmax
        router={"score": "softmax", "bias": True},
        expert_ffn={
            "bias": True,
            "activation": "clamped_swiglu",
            "alpha": float(hf.get("swiglu_alpha", 1.702)),
            "limit": float(hf.get("swiglu_limit", 7.0)),
        },
    )
