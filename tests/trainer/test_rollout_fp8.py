"""Emulated FP8 (e4m3) rollouts: the rounding equals torch's e4m3 round trip, and the gap grows."""

from __future__ import annotations

import pytest
import torch

from trainer import metric_keys as K
from trainer.algorithms.measure import mismatch_stats
from trainer.config import ModelConfig
from trainer.model import TransformerLM
from trainer.rollout import RolloutEngine
from trainer.rollout.numerics import FP8_MAX, Numerics, fp8_round

VOCAB = 24


def test_fp8_round_equals_scaled_e4m3_round_trip():
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(0)) * 3.7
    scale = x.abs().max() / 448.0
    expected = (x / scale).to(torch.float8_e4m3fn).to(torch.float32) * scale
    assert torch.equal(fp8_round(x), expected)
    assert torch.finfo(torch.float8_e4m3fn).max == FP8_MAX
    # amax maps onto 448 exactly: nothing saturates, the largest element survives.
    assert fp8_round(x).abs().max() == pytest.approx(x.abs().max().item(), rel=1e-6)


def test_fp8_round_by_hand():
    # scale = 448 / 448 = 1: e4m3 has 3 mantissa bits, so 1.0625 (halfway 1 and 1.125)
    # rounds to even 1.0, and 3.3 -> 3.25 (spacing 0.25 in [2, 4)).
    x = torch.tensor([448.0, 1.0625, 3.3, -0.0])
    assert fp8_round(x).tolist() == [448.0, 1.0, 3.25, 0.0]


def test_fp8_round_per_expert_scale():
    w = torch.stack((torch.full((2, 3), 0.01), torch.full((2, 3), 100.0)))
    w[0, 0, 0], w[1, 0, 0] = 0.02, 200.0
    rounded = fp8_round(w, dims=(1, 2))
    for e in range(2):  # each expert scaled by its own amax: both survive exactly
        scale = w[e].abs().max() / 448.0
        assert torch.equal(rounded[e], (w[e] / scale).to(torch.float8_e4m3fn).float() * scale)
    assert torch.equal(fp8_round(torch.zeros(3)), torch.zeros(3))


def test_fp8_engine_rounds_projection_weights_to_e4m3_and_keeps_router_bf16(tiny_moe_cfg):
    torch.manual_seed(0)
    model = TransformerLM(tiny_moe_cfg, vocab_size=VOCAB).eval()
    engine = RolloutEngine(tiny_moe_cfg, VOCAB, precision="fp8")
    sd = model.state_dict()
    engine.load_weights(sd)
    layer = engine.layers[0]
    assert torch.equal(layer.wqkv, fp8_round(sd["blocks.0.attn.qkv.weight"]))
    assert torch.equal(layer.experts_down, fp8_round(sd["blocks.0.ffn.experts.w_down"], (1, 2)))
    router = sd["blocks.0.ffn.router.weight"]
    assert torch.equal(layer.router, router.to(torch.bfloat16).float())
    num = Numerics("fp8")
    assert num.emulated and num.dtype == torch.float32
    x = torch.randn(5, 7)
    assert torch.equal(num.gemm_input(x), fp8_round(x))


def _k3_gap(precision: str, model, cfg, tokens, mask) -> float:
    engine = RolloutEngine(cfg, VOCAB, precision=precision)
    engine.load_weights(model.state_dict())
    fp32 = RolloutEngine(cfg, VOCAB, precision="fp32")
    fp32.load_weights(model.state_dict())
    lp, _ = engine.score(tokens, mask)
    ref, _ = fp32.score(tokens, mask)
    real = mask.clone()
    real[:, 0] = False
    return mismatch_stats(ref, lp, real)[K.MISMATCH_KL_K3]


def test_fp8_gap_is_larger_than_bf16(make_batch):
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=4, n_experts=8, top_k=2, expert_hidden=64)
    torch.manual_seed(0)
    model = TransformerLM(cfg, vocab_size=VOCAB).eval()
    tokens, mask = make_batch(VOCAB, [32] * 8, 32, seed=1)
    gaps = {p: _k3_gap(p, model, cfg, tokens, mask) for p in ("fp16", "bf16", "fp8")}
    # Mantissa bits 10 (fp16) > 7 (bf16) > 3 (e4m3): the k3 gap to fp32 must order the same way.
    assert 0 < gaps["fp16"] < gaps["bf16"] < gaps["fp8"], gaps
