"""The decode step's memory roofline (bench/roofline.py) against a hand count."""

from __future__ import annotations

import pytest

from bench.roofline import decode_step_bytes, expected_experts, roofline_s
from trainer.config import ModelConfig


def test_decode_step_bytes_by_hand():
    """2 layers, D 32, 4 heads (hd 8), 8 experts top-2 of width 16, vocabulary 64 (tied),
    batch 4 over 10 columns, 2 bytes:
    attention 32 x 96 + 32 x 32 = 4,096 and norms 64 per block, router 256, the head
    (the tied table) 2,048, final norm 32: 2 x 4,416 + 2,048 + 32 = 10,912 weights read
    whole; the batch's 4 embedding rows 128; each expert 3 x 32 x 16 = 1,536, of which
    4 tokens touch 8 (1 - 0.75^4) = 5.46875 per layer: 2 x 5.46875 x 1,536 = 16,800.
    Weights (10,912 + 128 + 16,800) x 2 = 55,680 bytes. KV: 2 x 2 layers x 4 rows x
    4 heads x 8 x 10 columns x 2 = 10,240 bytes."""
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_experts=8, top_k=2, expert_hidden=16)
    got = decode_step_bytes(cfg, 64, 4, 10, 2)
    assert got == {"weights": 55680.0, "kv_cache": 10240, "total": 65920.0}
    assert expected_experts(8, 2, 1) == pytest.approx(2.0)  # one token: its k experts
    assert roofline_s(4.8e12, "NVIDIA H200") == pytest.approx(1.0)
    assert roofline_s(1.0, "cpu") is None
