"""The rollout engine on DeepSeek-V3/V2, GLM-4.5 and GPT-OSS checkpoints at bf16 and fp8:
its log-probs and routing track the training forward by the engine's rounding only
(mean |log-prob diff| and routing inconsistency measured on the tiny checkpoints:
bf16 0.010-0.029 and 0.7-3.3%, fp8 0.08-0.16 and 9-16%; Qwen3-MoE's are 0.008 / 0% and
0.073 / 6%), every routed layer is recorded and no dense one, and a latent-attention
engine caches one (kv_lora_rank + qk_rope_head_dim) row per token and layer."""

from __future__ import annotations

import pytest
import torch
from hf_tiny_checkpoints import import_checkpoint, save_hf_checkpoint

from trainer.algorithms.measure import routing_mismatch
from trainer.rollout import RolloutEngine, prompt_logprobs

pytest.importorskip("transformers")

ROUTED = ("deepseek_v3", "deepseek_v2", "glm4_moe", "gpt_oss")
BOUNDS = {"bf16": (0.05, 0.1), "fp8": (0.25, 0.3)}  # mean |log-prob diff|, inconsistency


def _imported(tmp_path, family):
    save_hf_checkpoint(family, tmp_path)
    return import_checkpoint(tmp_path, max_seq_len=64)


@pytest.mark.parametrize("family", ROUTED)
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_low_precision_engines_track_the_training_forward(family, precision, tmp_path):
    cfg, model = _imported(tmp_path, family)
    tokens = torch.randint(0, cfg.vocab_size, (4, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[0, :4] = False
    with torch.no_grad():
        out = model(tokens, mask, return_routing=True)
    engine = RolloutEngine(cfg, cfg.vocab_size, precision=precision)
    engine.load_weights(model.state_dict())
    logprobs, routing = engine.score(tokens, mask)
    scored = mask.clone()
    scored[:, 0] = False
    scored[0, 4] = False  # a row's first real token has no log-prob
    diff = (logprobs - prompt_logprobs(out.logits, tokens, mask))[scored].abs().mean()
    gap = routing_mismatch(routing.unpack(), [r.natural_indices for r in out.routing], mask)
    assert routing.n_layers == len(out.routing) == cfg.n_moe_blocks
    logprob_bound, routing_bound = BOUNDS[precision]
    assert diff < logprob_bound
    assert gap["mismatch/routing_inconsistency"] < routing_bound


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v2"])
def test_the_latent_cache_holds_one_latent_row_per_token(family, tmp_path):
    cfg, model = _imported(tmp_path, family)
    engine = RolloutEngine(cfg, cfg.vocab_size, precision="bf16")
    engine.load_weights(model.state_dict())
    prompt = torch.randint(0, cfg.vocab_size, (2, 5))
    engine.generate(prompt, torch.ones_like(prompt, dtype=torch.bool), max_new_tokens=4)
    keys, values = engine.forward_pass.cache  # one tensor per layer
    m = cfg.mla
    assert len(keys) == len(values) == cfg.n_layers
    assert keys[0].shape == (2, 1, 9, m.kv_lora_rank + m.qk_rope_head_dim)
    # the values are the rows' first r columns
    assert all(v.data_ptr() == k.data_ptr() for k, v in zip(keys, values, strict=True))
    per_head = cfg.n_heads * (m.qk_head_dim + m.v_head_dim)
    assert keys[0].shape[-1] < per_head  # what expanded keys and values would take


NATIVE_SHAPED = {
    "deepseek_v3": {
        "mla": {"enabled": True, "q_lora_rank": 32, "kv_lora_rank": 32,
                "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16},
        "router": {"score": "sigmoid", "n_groups": 4, "topk_groups": 2, "scaling": 2.5},
        "shared_expert_hidden": 64, "dense_layers": [0], "dense_hidden": 64, "n_layers": 3,
    },
    "gpt_oss": {
        "attention_sinks": True, "attention_bias": "qkvo", "n_kv_heads": 2,
        "router": {"bias": True}, "sliding_window": 4, "sliding_layers": [0],
        "expert_ffn": {"bias": True, "activation": "clamped_swiglu", "limit": 1.0},
    },
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(NATIVE_SHAPED))
def test_native_fp8_projections_run_the_families_attention(family):
    """torch._scaled_mm (it runs on the CPU) on the latent attention's and the sinks'
    projections: the same tokens' log-probs as the emulated fp8 engine up to the
    native kernel's bf16 output rounding (measured: identical on the CPU; the experts stay
    emulated off sm90)."""
    from trainer.config import ModelConfig
    from trainer.model import TransformerLM

    cfg = ModelConfig.model_validate({"d_model": 64, "n_experts": 8, **NATIVE_SHAPED[family]})
    torch.manual_seed(0)
    policy = TransformerLM(cfg, 32)
    tokens = torch.randint(3, 32, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    out = []
    for mode in ("emulated", "native"):
        engine = RolloutEngine(cfg, 32, precision="fp8", fp8_gemm=mode)
        engine.load_weights(policy.state_dict())
        out.append(engine.score(tokens, mask)[0])
    assert engine.fp8_mode.startswith("native")
    torch.testing.assert_close(out[1], out[0], atol=0.05, rtol=0)
