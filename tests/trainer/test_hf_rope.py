"""RoPE scaling (linear, dynamic, yarn, llama3) and sliding-window attention:
parity with transformers on tiny checkpoints of the families that use them.

Each case is a tiny random checkpoint (tests/hf_tiny_checkpoints.py) whose
config turns the feature on at a scale the test's sequences cross: the
pretraining context is 16 positions and the window 5 keys, sequences are 24
(forward) and 7 + 32 (generation) long. In fp32 the lab must give

* training-forward logits within 1e-4 of transformers' on a left-padded batch,
* each MoE layer's top-k expert set = transformers',
* the rollout engine's greedy generation = ``generate(do_sample=False)``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hf_tiny_checkpoints import save_hf_checkpoint

from trainer.config import ExperimentConfig, RopeScalingConfig
from trainer.hf import build_model, resolve_model_source
from trainer.model.layers import positions_from_mask, rope_frequencies
from trainer.rollout.engine import RolloutEngine

transformers = pytest.importorskip("transformers")

LOGIT_TOL = 1e-4
ORIGINAL = 16
CASES = {
    "llama-llama3": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": ORIGINAL,
            }
        },
    ),
    "qwen3_moe-yarn": (
        "qwen3_moe",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": ORIGINAL,
            }
        },
    ),
    "qwen3-yarn-mscale": (
        "qwen3",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "mscale": 1.0,
                "mscale_all_dim": 0.5,
                "beta_fast": 16,
                "original_max_position_embeddings": ORIGINAL,
            }
        },
    ),
    "mixtral-linear": ("mixtral", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "olmoe-dynamic": (
        "olmoe",
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 16},
    ),
    "mixtral-sliding": ("mixtral", {"sliding_window": 5}),
    "qwen3_moe-sliding": ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 5}),
    "qwen2-sliding-upper-layers": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1},
    ),
    "qwen2_moe-sliding-alternate": (
        "qwen2_moe",
        {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 3},
    ),
}


def _import(folder):
    cfg = ExperimentConfig.model_validate({"model": {"source": str(folder), "max_seq_len": 256}})
    model_cfg = resolve_model_source(cfg).model
    return model_cfg, build_model(model_cfg, model_cfg.vocab_size).eval()


def _checkpoint(case, tmp_path):
    family, overrides = CASES[case]
    hf = save_hf_checkpoint(family, tmp_path, **overrides)
    cfg, model = _import(tmp_path)
    return hf, cfg, model


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_forward_logits_match_transformers(case, tmp_path):
    hf, cfg, model = _checkpoint(case, tmp_path)
    feature = cfg.rope_scaling.kind != "default" or cfg.sliding_window is not None
    assert feature, f"{case}: the checkpoint's feature was not imported"
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, cfg.vocab_size, (2, 24), generator=gen)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[0, :3] = False
    with torch.no_grad():
        ours = model(tokens, mask).logits
        theirs = hf(
            input_ids=tokens, attention_mask=mask.long(), position_ids=positions_from_mask(mask)
        ).logits
    diff = (ours - theirs)[mask].abs().max().item()
    assert diff < LOGIT_TOL, f"{case}: max |logit diff| {diff:.2e}"


@pytest.mark.parametrize("case", sorted(c for c in CASES if "moe" in c or "mixtral" in c))
def test_router_topk_sets_match_transformers(case, tmp_path):
    hf, cfg, model = _checkpoint(case, tmp_path)
    tokens = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ours = model(tokens, return_routing=True).routing
        theirs = hf(input_ids=tokens, output_router_logits=True).router_logits
    assert len(ours) == len(theirs) == cfg.n_moe_blocks
    for layer, (mine, logits) in enumerate(zip(ours, theirs, strict=True)):
        their_sets = logits.view(2, 24, -1).topk(cfg.top_k, dim=-1).indices.sort(-1).values
        assert torch.equal(mine.natural_indices.sort(-1).values, their_sets), (
            f"{case} MoE layer {layer}: top-k sets differ"
        )


@pytest.mark.parametrize("case", sorted(CASES))
def test_rollout_engine_greedy_generation_matches_transformers(case, tmp_path):
    hf, cfg, model = _checkpoint(case, tmp_path)
    engine = RolloutEngine(cfg, cfg.vocab_size, precision="fp32")
    engine.load_weights(model.state_dict())
    prompt = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(prompt, dtype=torch.bool)
    ours = engine.generate(prompt, mask, max_new_tokens=32, temperature=0.0).tokens
    with torch.no_grad():
        theirs = hf.generate(
            prompt,
            attention_mask=mask.long(),
            max_new_tokens=32,
            do_sample=False,
            min_new_tokens=32,
        )
    assert torch.equal(ours, theirs), f"{case}: generations differ"


def test_sliding_layers_follow_each_familys_rule(tmp_path):
    _, qwen2, _ = _checkpoint("qwen2-sliding-upper-layers", tmp_path / "a")
    assert qwen2.sliding_window == 5 and qwen2.sliding_layers == [1, 2]
    _, qwen2_moe, _ = _checkpoint("qwen2_moe-sliding-alternate", tmp_path / "b")
    assert qwen2_moe.sliding_layers == [0, 2]
    _, mixtral, _ = _checkpoint("mixtral-sliding", tmp_path / "c")
    assert mixtral.sliding_window == 5 and mixtral.sliding_layers is None


def test_rope_frequencies_by_hand():
    """Hand-computed frequencies for head_dim 4, base 100: theta = (1, 0.1)."""
    plain, scale = rope_frequencies(4, 100.0)
    assert torch.allclose(plain, torch.tensor([1.0, 0.1])) and scale == 1.0
    linear, _ = rope_frequencies(4, 100.0, RopeScalingConfig(kind="linear", factor=2.0))
    assert torch.allclose(linear, torch.tensor([0.5, 0.05]))
    dynamic = RopeScalingConfig(kind="dynamic", factor=2.0, max_positions=8)
    inside, _ = rope_frequencies(4, 100.0, dynamic, seq_len=8)
    assert torch.allclose(inside, plain)
    # past the context: base * (2 * 16 / 8 - 1)^(4 / 2) = 100 * 9 = 900
    grown, _ = rope_frequencies(4, 100.0, dynamic, seq_len=16)
    assert torch.allclose(grown, torch.tensor([1.0, 1 / 30]))
    _, yarn_scale = rope_frequencies(
        4, 100.0, RopeScalingConfig(kind="yarn", factor=4.0, max_positions=8)
    )
    assert yarn_scale == pytest.approx(0.1 * math.log(4.0) + 1)
