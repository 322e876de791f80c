"""The rollout engine on DeepSeek-V3/V2, GLM-4.5 and GPT-OSS checkpoints at bf16 and fp8:
its log-probs and routing track the training forward by the engine's rounding only
(mean |log-prob diff| and routing inconsistency measured on the tiny checkpoints:
bf16 0.010-0.029 and 0.7-3.3%, fp8 0.08-0.16 and 9-16%; Qwen3-MoE's are 0.008 / 0% and
0.073 / 6%), every routed layer is recorded and no dense one, and a latent-attention
engine caches one (kv_lora_rank + qk_rope_head_dim) row per token and layer."""

from __future__ import annotations

import pytest
import torch
from hf_tiny_checkpoints import save_hf_checkpoint

from trainer.algorithms.measure import routing_mismatch
from trainer.config import ExperimentConfig
from trainer.hf import build_model, resolve_model_source
from trainer.rollout import RolloutEngine, prompt_logprobs

pytest.importorskip("transformers")

ROUTED = ("deepseek_v3", "deepseek_v2", "glm4_moe", "gpt_oss")
BOUNDS = {"bf16": (0.05, 0.1), "fp8": (0.25, 0.3)}  # mean |log-prob diff|, inconsistency


def _imported(tmp_path, family):
    save_hf_checkpoint(family, tmp_path)
    cfg = ExperimentConfig.model_validate({"model": {"source": str(tmp_path), "max_seq_len": 64}})
    model_cfg = resolve_model_source(cfg).model
    return model_cfg, build_model(model_cfg, model_cfg.vocab_size).eval()


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
