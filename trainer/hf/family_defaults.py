"""Each supported family's config-class defaults (transformers 5's ``XConfig()``), for
the config.json keys the mapping reads (``trainer.hf.families``): a checkpoint that
omits a key gets what transformers would give it (tested against the classes in
tests/trainer/test_hf_families.py). ``None`` = derived (kv heads = heads, head_dim =
hidden / heads, no groups). Torch-free.
"""

from __future__ import annotations

from typing import Any

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
    "deepseek_v3": {
        "vocab_size": 129280, "hidden_size": 7168, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": None, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 3, "norm_topk_prob": True, "kv_lora_rank": 512,
        "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "rope_interleave": True, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "rope_theta": 10000.0, "max_position_embeddings": 4096,
        "attention_bias": False,
    },
    "deepseek_v2": {
        "vocab_size": 102400, "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": None, "intermediate_size": 11008,
        "moe_intermediate_size": 1407, "n_routed_experts": 64, "n_shared_experts": 2,
        "n_group": None, "topk_group": None, "topk_method": "greedy",
        "routed_scaling_factor": 1.0, "first_k_dense_replace": 0, "norm_topk_prob": False,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "rope_theta": 10000.0, "max_position_embeddings": 2048,
        "attention_bias": False, "mlp_bias": False,
    },
    "glm4_moe": {
        "vocab_size": 151552, "hidden_size": 4096, "num_hidden_layers": 46,
        "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": None,
        "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 128,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
        "routed_scaling_factor": 1.0, "first_k_dense_replace": 1, "norm_topk_prob": True,
        "use_qk_norm": False, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "rope_theta": 10000.0, "max_position_embeddings": 131072,
        "attention_bias": False,
    },
    "gpt_oss": {
        "vocab_size": 201088, "hidden_size": 2880, "num_hidden_layers": 36,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "intermediate_size": 2880, "num_local_experts": 128, "num_experts_per_tok": 4,
        "sliding_window": 128, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 150000.0,
        "max_position_embeddings": 131072, "attention_bias": True,
        "rope_parameters": {
            "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 4096,
        },
    },
}  # fmt: skip


def with_family_defaults(hf: dict[str, Any]) -> dict[str, Any]:
    """``hf`` with every key its family's config class defaults filled in (a key
    present with null stays null only where the class keeps null)."""
    defaults = FAMILY_DEFAULTS.get(hf.get("model_type"), {})
    out = dict(hf)
    # transformers 5 spells the expert count num_local_experts in some families'
    # files and num_experts / n_routed_experts in others: any one present is the count.
    experts = {"num_experts", "num_local_experts", "n_routed_experts"}
    # A checkpoint's rope dict (either spelling) replaces the class's default rope.
    ropes = {"rope_parameters", "rope_scaling"}
    for key, value in defaults.items():
        if (key in experts and experts & set(out)) or (key in ropes and ropes & set(out)):
            continue
        if key not in out:
            out[key] = value
    return out
