"""Export of the features of ``trainer.config.model_parts`` (latent attention, sinks,
partial rotary, routers, expert FFNs) and of the DeepSeek-V3/V2, GLM-4.5 and GPT-OSS
config keys: what a family cannot express (``feature_problems``, refused by
``trainer.hf.export_config.inexpressible``) and the config.json keys each of these
families needs (``routed_config``), the inverse of ``trainer.hf.families_routed``.
Torch-free.
"""

from __future__ import annotations

from typing import Any

from trainer.config import ExpertFfnConfig, ModelConfig

# (score, logit bias, group score) of a family's router; a family left out of
# EXPRESSIBLE's "router" key has the default softmax router without groups.
DEFAULT_ROUTER = ("softmax", False, None)
SCALED_ROUTER_FAMILIES = ("deepseek_v3", "deepseek_v2", "glm4_moe")


def feature_problems(cfg: ModelConfig, family: str, rules: dict[str, Any]) -> list[str]:
    """The attention features ``family`` cannot express, then (MoE models of an MoE
    family) the routing and expert ones."""
    problems = []
    if cfg.mla.enabled != rules.get("mla", False):
        problems.append(
            "latent attention (model.mla)" if cfg.mla.enabled else "no latent attention"
        )
    if cfg.attention_sinks != rules.get("sinks", False):
        problems.append("attention sinks" if cfg.attention_sinks else "no attention sinks")
    if cfg.rotary_fraction != 1.0 and not rules.get("partial_rotary"):
        problems.append(f"partial rotary (rotary_fraction={cfg.rotary_fraction})")
    if not (cfg.is_moe and rules["moe"]):
        return problems
    score, bias, group_score = rules.get("router", DEFAULT_ROUTER)
    router = cfg.router
    if router.score != score:
        problems.append(f"a {router.score} router (it has {score})")
    if router.bias != bias:
        problems.append("a router logit bias" if router.bias else "no router logit bias")
    if router.grouped and router.group_score != group_score:
        problems.append(f"group-limited routing by {router.group_score}")
    if router.scaling != 1.0 and family not in SCALED_ROUTER_FAMILIES:
        problems.append(f"router.scaling={router.scaling}")
    gpt_oss_experts = ExpertFfnConfig(
        bias=True,
        activation="clamped_swiglu",
        alpha=cfg.expert_ffn.alpha,
        limit=cfg.expert_ffn.limit,
    )
    wanted = gpt_oss_experts if rules.get("expert_ffn") == "gpt_oss" else ExpertFfnConfig()
    if cfg.expert_ffn != wanted:
        problems.append(f"experts with bias={cfg.expert_ffn.bias}, {cfg.expert_ffn.activation}")
    if rules["shared"] == "ungated":
        shared = cfg.shared_expert_hidden
        if not shared or cfg.shared_expert_gate or shared % cfg.expert_hidden:
            problems.append(
                "a shared expert that is not ungated and a multiple of expert_hidden "
                "(it has n_shared_experts of the experts' width)"
            )
    if rules["dense_layers"] == "prefix" and cfg.dense_layers != list(range(len(cfg.dense_layers))):
        problems.append(f"dense blocks {cfg.dense_layers} (it has the first k only)")
    return problems


def _moe_keys(cfg: ModelConfig) -> dict[str, Any]:
    """The DeepSeek-style MoE keys DeepSeek-V3/V2 and GLM-4.5 share."""
    return {
        "n_routed_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.top_k,
        "moe_intermediate_size": cfg.expert_hidden,
        "n_shared_experts": cfg.shared_expert_hidden // cfg.expert_hidden,
        "first_k_dense_replace": len(cfg.dense_layers),
        "intermediate_size": cfg.resolved_dense_hidden,
        "n_group": cfg.router.n_groups,
        "topk_group": cfg.router.topk_groups,
        "routed_scaling_factor": cfg.router.scaling,
        "norm_topk_prob": cfg.norm_topk_prob,
    }


def routed_config(cfg: ModelConfig, family: str) -> dict[str, Any]:
    """config.json keys of ``family`` (one of the routed families) for ``cfg``."""
    if family == "gpt_oss":
        return {
            "num_local_experts": cfg.n_experts,
            "num_experts_per_tok": cfg.top_k,
            "intermediate_size": cfg.expert_hidden,
            "swiglu_alpha": cfg.expert_ffn.alpha,
            "swiglu_limit": cfg.expert_ffn.limit,
            "attention_bias": cfg.attention_bias == "qkvo",
            "layer_types": [
                "sliding_attention" if cfg.uses_sliding_window(i) else "full_attention"
                for i in range(cfg.n_layers)
            ],
            "sliding_window": cfg.sliding_window,
        }
    out = _moe_keys(cfg)
    # The exported weights hold no multi-token-prediction layer.
    out["num_nextn_predict_layers"] = 0
    if family == "glm4_moe":
        out.update(
            use_qk_norm=cfg.qk_norm == "head",
            attention_bias=cfg.attention_bias == "qkv",
            partial_rotary_factor=cfg.rotary_fraction,
        )
        return out
    m = cfg.mla
    out.update(
        q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank,
        qk_nope_head_dim=m.qk_nope_head_dim,
        qk_rope_head_dim=m.qk_rope_head_dim,
        v_head_dim=m.v_head_dim,
        head_dim=m.qk_rope_head_dim,  # transformers' rotary reads head_dim
        num_key_value_heads=cfg.n_heads,
        attention_bias=False,
    )
    if family == "deepseek_v3":
        out["rope_interleave"] = True  # the weight plan writes the rotary rows in pairs
        return out
    out.pop("num_nextn_predict_layers")
    out.update(
        topk_method="group_limited_greedy" if cfg.router.grouped else "greedy",
        mlp_bias=False,
    )
    return out
