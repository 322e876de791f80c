"""The parameter estimator matches the real model's parameter count."""

from __future__ import annotations

import pytest

from trainer.model.param_count import config_params, format_params, model_params
from trainer.model.shapes import parameter_shapes
from trainer.model.transformer import TransformerLM
from trainer.tasks.factory import make_task
from trainer.validation import validate_config

CASES = [
    {},  # the defaults: MoE, rope, tied
    {"model": {"n_experts": 0}},  # dense, dense_hidden = top_k * expert_hidden
    {"model": {"n_experts": 0, "dense_hidden": 96}},
    {"model": {"shared_expert_hidden": 64, "n_experts": 4, "top_k": 1}},
    {"model": {"positional": "learned", "tie_embeddings": False, "n_layers": 3}},
    {"model": {"vocab_size": 300, "d_model": 64, "n_heads": 2}},
    # Hugging Face families' features: GQA + head_dim + per-head q/k norm + dense block
    {"model": {"n_kv_heads": 2, "head_dim": 24, "qk_norm": "head", "dense_layers": [1],
               "dense_hidden": 96, "tie_embeddings": False}},
    # q/k/v biases + gated shared expert (Qwen2-MoE); full q/k norm + o bias
    {"model": {"attention_bias": "qkv", "shared_expert_hidden": 48, "shared_expert_gate": True}},
    {"model": {"attention_bias": "qkvo", "qk_norm": "full", "n_kv_heads": 1}},
    # DeepSeek: latent attention (with and without q compression), ungated shared
    # expert, sigmoid router in groups, dense first block
    {"model": {"mla": {"enabled": True, "q_lora_rank": 24, "kv_lora_rank": 16},
               "shared_expert_hidden": 32, "dense_layers": [0], "dense_hidden": 96,
               "router": {"score": "sigmoid", "n_groups": 4, "topk_groups": 2}}},
    {"model": {"mla": {"enabled": True, "v_head_dim": 8}, "tie_embeddings": False}},
    # GPT-OSS: sinks, router bias, expert biases; GLM-4.5: partial rotary
    {"model": {"attention_sinks": True, "attention_bias": "qkvo", "router": {"bias": True},
               "expert_ffn": {"bias": True, "activation": "clamped_swiglu"}}},
    {"model": {"rotary_fraction": 0.5, "qk_norm": "head", "attention_bias": "qkv"}},
]  # fmt: skip


def _real_count(model) -> int:
    # parameters() yields a tied tensor once, as the estimator counts it
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("overrides", CASES)
@pytest.mark.parametrize("value_head", [False, True])
def test_estimate_equals_the_built_model(overrides, value_head):
    cfg = validate_config(overrides)
    vocab = cfg.model.vocab_size or make_task(cfg.task).tokenizer.vocab_size
    model = TransformerLM(cfg.model, vocab, value_head=value_head)
    assert model_params(cfg.model, vocab, value_head) == _real_count(model)


@pytest.mark.parametrize("overrides", CASES)
def test_parameter_shapes_are_the_built_models(overrides):
    """trainer.model.shapes names every parameter with its shape (the validator's
    expected checkpoint shapes come from it)."""
    cfg = validate_config(overrides)
    vocab = cfg.model.vocab_size or make_task(cfg.task).tokenizer.vocab_size
    model = TransformerLM(cfg.model, vocab, value_head=True)
    real = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert parameter_shapes(cfg.model, vocab, value_head=True) == real


def test_active_parameters_count_top_k_experts_with_their_biases():
    cfg = validate_config({"model": {"expert_ffn": {"bias": True}, "n_experts": 8, "top_k": 2}})
    m = cfg.model
    per_expert = 3 * m.d_model * m.expert_hidden + 2 * m.expert_hidden + m.d_model
    total, active = model_params(m, 50), model_params(m, 50, active=True)
    assert total - active == m.n_layers * (8 - 2) * per_expert


def test_config_params_adds_ppos_value_head():
    grpo = validate_config({})
    ppo = validate_config({"algorithm": {"name": "ppo"}})
    assert config_params(ppo) - config_params(grpo) == grpo.model.d_model + 1


def test_a_huge_moe_is_counted_without_building_it():
    cfg = validate_config({"model": {"n_experts": 512, "n_layers": 64, "top_k": 2}})
    # 64 layers x 512 experts x 3 x 128 x 256 expert weights alone are 3.2B
    assert config_params(cfg) > 3_200_000_000


@pytest.mark.parametrize(
    "count, text",
    [(950, "950"), (12_300_000, "12.3M"), (18_200_000_000, "18.2B"), (2_000_000_000, "2.0B")],
)
def test_format_params(count, text):
    assert format_params(count) == text


def test_active_parameters_count_top_k_experts_per_moe_block():
    cfg = validate_config({"model": {"dense_layers": [0], "n_layers": 3}})
    m = cfg.model
    total = model_params(m, 51)
    active = model_params(m, 51, active=True)
    # 2 MoE blocks x (E - top_k) = 6 unused experts of 3*D*H_e each
    assert total - active == 2 * 6 * 3 * m.d_model * m.expert_hidden
    dense = validate_config({"model": {"n_experts": 0}}).model
    assert model_params(dense, 51) == model_params(dense, 51, active=True)
