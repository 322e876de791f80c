"""The Hugging Face architecture features of the lab's own model, without
transformers: the rollout engine agrees with the training forward on GQA,
q/k norm, biases, un-normalised gates, gated shared experts and dense blocks,
and on DeepSeek's latent attention (the engine's absorbed attention over its latent
cache), sigmoid group-limited routing with a selection bias and routed scaling,
GLM-4.5's partial rotary and GPT-OSS's sinks, biases and clamped SwiGLU;
Mixtral's routing equals softmax-then-renormalise; activation checkpointing
leaves gradients unchanged; bad combinations are field errors."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ModelConfig
from trainer.errors import FieldError
from trainer.model import TransformerLM, topk_gates
from trainer.rollout import RolloutEngine, prompt_logprobs
from trainer.validation import validate_config

VOCAB = 24
BASE = {"n_layers": 3, "d_model": 48, "n_heads": 4, "n_experts": 6, "top_k": 2, "expert_hidden": 16}
VARIANTS = {
    "qwen3_moe-like": {
        "n_kv_heads": 2,
        "head_dim": 10,
        "qk_norm": "head",
        "dense_layers": [1],
        "dense_hidden": 40,
        "rope_theta": 1e6,
        "tie_embeddings": False,
    },
    "qwen2_moe-like": {
        "n_kv_heads": 1,
        "attention_bias": "qkv",
        "norm_topk_prob": False,
        "shared_expert_hidden": 24,
        "shared_expert_gate": True,
    },
    "olmoe-like": {"n_kv_heads": 2, "qk_norm": "full", "attention_bias": "qkvo"},
    # Multi-head with biases: the decode path that rotates q and k as one view.
    "llama-bias-like": {"attention_bias": "qkvo", "norm_topk_prob": False},
    "deepseek_v3-like": {
        "mla": {"enabled": True, "q_lora_rank": 12, "kv_lora_rank": 16,
                "qk_nope_head_dim": 8, "qk_rope_head_dim": 6, "v_head_dim": 10},
        "router": {"score": "sigmoid", "n_groups": 3, "topk_groups": 2, "scaling": 2.5},
        "shared_expert_hidden": 16, "dense_layers": [0], "dense_hidden": 40,
        "rope_scaling": {"kind": "yarn", "factor": 4.0, "max_positions": 8,
                         "mscale_all_dim": 0.8},
    },
    "deepseek_v2-like": {
        "mla": {"enabled": True, "kv_lora_rank": 12, "qk_nope_head_dim": 6,
                "qk_rope_head_dim": 4, "v_head_dim": 8},
        "router": {"score": "softmax", "n_groups": 3, "topk_groups": 2, "group_score": "max",
                   "scaling": 1.5},
        "norm_topk_prob": False, "shared_expert_hidden": 32,
    },
    "glm4_moe-like": {
        "n_kv_heads": 2, "rotary_fraction": 0.5, "qk_norm": "head", "attention_bias": "qkv",
        "router": {"score": "sigmoid", "n_groups": 2, "topk_groups": 1, "scaling": 1.5},
        "shared_expert_hidden": 16, "dense_layers": [0], "dense_hidden": 40,
    },
    "gpt_oss-like": {
        "n_kv_heads": 2, "attention_sinks": True, "attention_bias": "qkvo",
        "sliding_window": 3, "sliding_layers": [0, 2], "router": {"bias": True},
        "expert_ffn": {"bias": True, "activation": "clamped_swiglu", "limit": 1.0},
    },
}  # fmt: skip


def perturbed_model(cfg: ModelConfig, seed: int = 0) -> TransformerLM:
    """Random model whose norm weights and biases are not 1 / 0 (so they matter)."""
    torch.manual_seed(seed)
    model = TransformerLM(cfg, VOCAB).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("bias", "sinks", ".b_gate", ".b_up", ".b_down")):
                param.normal_(0.0, 0.1)
            elif param.dim() == 1:
                param.uniform_(0.5, 1.5)
        if cfg.router.score == "sigmoid":  # DeepSeek-V3's live correction bias
            for layer in model.moe_layers:
                layer.router.selection_bias.normal_(0.0, 0.05)
    return model


def left_padded(lengths: list[int], width: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, VOCAB, (len(lengths), width), generator=gen)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = True
    return tokens.masked_fill(~mask, 0), mask


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fp32_engine_generation_matches_the_training_forward(variant):
    cfg = ModelConfig(**BASE, **VARIANTS[variant])
    model = perturbed_model(cfg)
    engine = RolloutEngine(cfg, VOCAB, precision="fp32")
    engine.load_weights(model.state_dict())
    prompt, mask = left_padded([3, 6, 5], 6)
    batch = engine.generate(prompt, mask, 10, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(batch.tokens, batch.attention_mask, return_routing=True)
    train_lp = prompt_logprobs(out.logits, batch.tokens, batch.attention_mask)
    real = batch.attention_mask
    torch.testing.assert_close(batch.logprobs[real], train_lp[real], rtol=0, atol=1e-4)
    assert len(out.routing) == cfg.n_moe_blocks == batch.routing.n_layers
    fed = batch.routing.routing_mask
    for engine_idx, train in zip(batch.routing.unpack(), out.routing, strict=True):
        same = engine_idx.sort(-1).values == train.natural_indices.sort(-1).values
        assert same.all(-1)[fed].all()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_bf16_kv_cache_decode_equals_full_recompute(variant):
    cfg = ModelConfig(**BASE, **VARIANTS[variant])
    engine = RolloutEngine(cfg, VOCAB, precision="bf16")
    engine.load_weights(perturbed_model(cfg).state_dict())
    prompt, mask = left_padded([3, 5], 5, seed=1)
    runs = [
        engine.generate(prompt, mask, 8, generator=torch.Generator().manual_seed(4), use_kv_cache=c)
        for c in (True, False)
    ]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    torch.testing.assert_close(runs[0].logprobs, runs[1].logprobs, rtol=0, atol=1e-5)
    assert torch.equal(runs[0].routing.indices, runs[1].routing.indices)


def test_mixtral_topk_logits_then_softmax_equals_softmax_then_renormalise():
    logits = torch.randn(64, 8, generator=torch.Generator().manual_seed(0)) * 3
    top = logits.topk(2, dim=-1)
    mixtral = top.values.softmax(-1)  # softmax over the selected logits (Mixtral paper)
    ours = topk_gates(logits.softmax(-1), top.indices)  # the lab's router
    torch.testing.assert_close(ours, mixtral, rtol=0, atol=1e-6)
    assert torch.equal(logits.softmax(-1).topk(2).indices, top.indices)


def test_unnormalised_gates_are_the_full_softmax_probabilities():
    probs = torch.randn(5, 6).softmax(-1)
    idx = probs.topk(2).indices
    assert torch.equal(topk_gates(probs, idx, normalize=False), probs.gather(-1, idx))


@pytest.mark.parametrize("variant", ["qwen2_moe-like", "qwen3_moe-like"])
@pytest.mark.parametrize("noisy", [False, True])
def test_activation_checkpointing_gives_the_same_gradients(variant, noisy):
    cfg = ModelConfig(**BASE, **VARIANTS[variant])
    grads = []
    for checkpointing in (False, True):
        model = perturbed_model(cfg.model_copy(update={"activation_checkpointing": checkpointing}))
        model.train()
        if noisy:
            model.enable_noisy_gating(0.5, torch.Generator().manual_seed(9))
        tokens, mask = left_padded([6, 4], 6, seed=2)
        out = model(tokens, mask, return_routing=True)
        loss = out.logits.logsumexp(-1)[mask].mean() + sum(r.gates.sum() for r in out.routing)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        if noisy:  # the generator ends where it would without recompute
            grads[-1]["__next_noise__"] = torch.randn(
                3, generator=model.moe_layers[0].router.noise_generator
            )
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"n_heads": 4, "n_kv_heads": 3}, "model.n_kv_heads"),
        ({"shared_expert_gate": True}, "model.shared_expert_gate"),
        ({"dense_layers": [5]}, "model.dense_layers"),
        ({"n_experts": 0, "dense_layers": [0]}, "model.dense_layers"),
        ({"qk_norm": "rms"}, "model.qk_norm"),
        ({"head_dim": 7}, "model.positional"),
        ({"mla": {"enabled": True}, "qk_norm": "head"}, "model.qk_norm"),
        ({"mla": {"enabled": True}, "attention_sinks": True}, "model.attention_sinks"),
        ({"mla": {"qk_rope_head_dim": 5}}, "model.mla.qk_rope_head_dim"),
        ({"router": {"n_groups": 3, "topk_groups": 2}}, "model.router"),
        ({"router": {"n_groups": 2, "topk_groups": 3}}, "model.router.topk_groups"),
        ({"n_experts": 8, "top_k": 3, "router": {"n_groups": 4, "topk_groups": 1}}, "model.top_k"),
        ({"head_dim": 10, "rotary_fraction": 0.3}, "model.rotary_fraction"),
    ],
)
def test_bad_architecture_fields_are_field_errors(model, field):
    with pytest.raises(FieldError) as exc:
        validate_config({"model": model})
    assert field in exc.value.as_dict()
