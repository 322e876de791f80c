"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434, sec. 2.1) for the
training model.

Per token, with H heads, d_n = qk_nope_head_dim, d_r = qk_rope_head_dim, d_v =
v_head_dim, r = kv_lora_rank:

    q        = W_qb RMSNorm(W_qa x)  (or W_q x without q_lora_rank)   (H, d_n + d_r)
    [c, k_r] = W_kva x                                                 (r + d_r)
    c        = RMSNorm(c)                                              the latent a cache keeps
    [k_n, v] = W_kvb c                                                 (H, d_n + d_v)
    k        = [k_n, rope(k_r)]   (k_r shared by the heads)
    q        = [q_n, rope(q_r)]
    y        = W_o softmax(q k^T * scale) v,  scale = (d_n + d_r)^-1/2 * mscale^2

with mscale = 0.1 mscale_all_dim ln(factor) + 1 under yarn (``mla_softmax_scale``).
The latents' norms use eps 1e-6 whatever ``rms_norm_eps`` says, as transformers'
DeepSeek-V2/V3 (``DeepseekV3RMSNorm(q_lora_rank)``). DeepSeek stores the rotary dims
interleaved in pairs; the import permutes those weight rows once into the rotate-half
layout (``trainer.hf.weights``), so one rotary formula serves every family. The
training forward expands keys and values per head, as transformers does; the
rollout engine attends over the cached latent instead (``trainer.rollout.mla``).
Shapes: B batch, T new tokens, S keys.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ModelConfig
from trainer.model.layers import KVCache, RMSNorm, apply_rotary

MLA_NORM_EPS = 1e-6


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN eq. 21: 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_softmax_scale(cfg: ModelConfig) -> float:
    """(d_n + d_r)^-1/2, times mscale(factor, mscale_all_dim)^2 under scaled rope with
    ``mscale_all_dim`` (transformers' ``yarn_apply_mscale``)."""
    scale = cfg.mla.qk_head_dim**-0.5
    rope = cfg.rope_scaling
    if rope.kind != "default" and rope.mscale_all_dim:
        m = yarn_mscale(rope.factor, rope.mscale_all_dim)
        scale = scale * m * m
    return scale


class MultiLatentAttention(nn.Module):
    """``MultiLatentAttention(cfg)``: the module docstring's attention, same call as
    ``CausalSelfAttention``. Parameters: ``q_a``, ``q_a_norm``, ``q_b`` (or ``q``),
    ``kv_a``, ``kv_a_norm``, ``kv_b``, ``proj``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m = cfg.mla
        self.n_heads = h = cfg.n_heads
        self.nope, self.rope, self.v_dim = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        self.rank = m.kv_lora_rank
        d, qk = cfg.d_model, m.qk_head_dim
        self.q = self.q_a = self.q_a_norm = self.q_b = None
        if m.q_lora_rank:
            self.q_a = nn.Linear(d, m.q_lora_rank, bias=False)
            self.q_a_norm = RMSNorm(m.q_lora_rank, MLA_NORM_EPS)
            self.q_b = nn.Linear(m.q_lora_rank, h * qk, bias=False)
        else:
            self.q = nn.Linear(d, h * qk, bias=False)
        self.kv_a = nn.Linear(d, self.rank + self.rope, bias=False)
        self.kv_a_norm = RMSNorm(self.rank, MLA_NORM_EPS)
        self.kv_b = nn.Linear(self.rank, h * (self.nope + self.v_dim), bias=False)
        self.proj = nn.Linear(h * self.v_dim, d, bias=False)
        self.scale = mla_softmax_scale(cfg)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, D) -> q (B, T, H * (d_n + d_r))."""
        if self.q is not None:
            return self.q(x)
        return self.q_b(self.q_a_norm(self.q_a(x)))

    def forward(
        self,
        x: torch.Tensor,
        mask4d: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        """x: (B, T, D); mask4d: (B, 1, T, S) bool; rope: cos, sin (B, 1, T, d_r)."""
        b, t, _ = x.shape
        h = self.n_heads
        q = self.queries(x).view(b, t, h, self.nope + self.rope).transpose(1, 2)
        q_nope, q_rope = q.split((self.nope, self.rope), dim=-1)
        latent, k_rope = self.kv_a(x).split((self.rank, self.rope), dim=-1)
        kv = self.kv_b(self.kv_a_norm(latent)).view(b, t, h, self.nope + self.v_dim)
        k_nope, v = kv.transpose(1, 2).split((self.nope, self.v_dim), dim=-1)
        k_rope = apply_rotary(k_rope.view(b, 1, t, self.rope), *rope)
        q = torch.cat((q_nope, apply_rotary(q_rope, *rope)), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(b, h, t, self.rope)), dim=-1)
        if kv_cache is not None:
            k, v = kv_cache.append(layer, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask4d, scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(b, t, h * self.v_dim))
