"""Multi-head latent attention in the rollout engine: the latent cache and the absorbed
attention an inference engine runs (DeepSeek-V2, arXiv 2405.04434, sec. 2.1.2; vLLM's
and SGLang's MLA decode).

The training model (``trainer.model.mla``) expands every cached latent into per-head
keys and values. The engine caches, per token and layer, only what attention needs:
the normed latent c (r = kv_lora_rank) and the rotated shared key k_r (d_r): one row of
r + d_r numbers instead of H (d_n + d_r + d_v) for per-head keys and values. The
up-projections are absorbed into the query and the output instead:

    q_n . (W_uk[h] c)  =  (W_uk[h]^T q_n) . c             a query in latent space
    sum_s a_s (W_uv[h] c_s)  =  W_uv[h] (sum_s a_s c_s)    the output from the latent

so each head attends with the (r + d_r) query [W_uk[h]^T q_n, rope(q_r)] over the
cached rows [c, rope(k_r)], and the values are the rows' first r columns: multi-query
attention over the latent. The sums are regrouped, so logits agree with the training
forward to float rounding, not bit for bit (tests/trainer/test_hf_model_features.py).

Shapes: B batch, T new tokens, S cache columns, H heads, d_n/d_r/d_v the head widths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.model.layers import rms_norm
from trainer.model.mla import MLA_NORM_EPS
from trainer.rollout.fp8 import Fp8Weight

Proj = torch.Tensor | Fp8Weight


@dataclass
class MlaWeights:
    """One block's latent attention in the engine's layout and precision."""

    kv_a: Proj  # (r + d_r, D)
    kv_a_norm: torch.Tensor  # (r,)
    w_uk: torch.Tensor  # (H, d_n, r): key up-projection, absorbed into the query
    w_uv: torch.Tensor  # (H, d_v, r): value up-projection, absorbed into the output
    q: Proj | None = None  # (H (d_n + d_r), D) without q compression
    q_a: Proj | None = None  # (q_lora, D)
    q_a_norm: torch.Tensor | None = None  # (q_lora,)
    q_b: Proj | None = None  # (H (d_n + d_r), q_lora)


def load_mla(engine, sd: dict[str, torch.Tensor], prefix: str) -> MlaWeights:
    """The latent attention of ``prefix`` (``blocks.{i}.attn.``) from the training
    state_dict: projections as the engine's GEMM weights, kv_b split per head."""
    m = engine.cfg.mla
    w = engine.num.weight

    def g(key: str):
        return engine.num.gemm_weight(sd[prefix + key], prefix + key)

    kv_b = w(sd[prefix + "kv_b.weight"]).view(
        engine.cfg.n_heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank
    )
    out = MlaWeights(
        kv_a=g("kv_a.weight"),
        kv_a_norm=w(sd[prefix + "kv_a_norm.weight"]),
        w_uk=kv_b[:, : m.qk_nope_head_dim].contiguous(),
        w_uv=kv_b[:, m.qk_nope_head_dim :].contiguous(),
    )
    if m.q_lora_rank:
        out.q_a, out.q_b = g("q_a.weight"), g("q_b.weight")
        out.q_a_norm = w(sd[prefix + "q_a_norm.weight"])
    else:
        out.q = g("q.weight")
    return out


def latent_rows(
    engine, mla: MlaWeights, h: torch.Tensor, rotate: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored activations h (B, T, D) -> (query (B, H, T, r + d_r), cache rows
    (B, 1, T, r + d_r)); ``rotate`` applies this step's rotary to (..., d_r)."""
    num, m = engine.num, engine.cfg.mla
    b, t, _ = h.shape
    if mla.q is not None:
        q = num.linear(h, mla.q)
    else:
        q_lat = num.round_(_latent_norm(num.linear(h, mla.q_a), mla.q_a_norm))
        q = num.linear(q_lat, mla.q_b)
    q = q.view(b, t, engine.n_heads, m.qk_head_dim).transpose(1, 2)  # (B, H, T, d_n + d_r)
    q_nope, q_rope = q.split((m.qk_nope_head_dim, m.qk_rope_head_dim), dim=-1)
    # Absorb W_uk: (B, H, T, d_n) @ (H, d_n, r) -> (B, H, T, r).
    q_lat = num.round_(q_nope @ mla.w_uk)
    latent, k_rope = num.linear(h, mla.kv_a).split((m.kv_lora_rank, m.qk_rope_head_dim), dim=-1)
    latent = num.round_(_latent_norm(latent, mla.kv_a_norm))
    k_rope = num.round_(rotate(k_rope.reshape(b, 1, t, m.qk_rope_head_dim)))
    query = torch.cat((q_lat, num.round_(rotate(q_rope))), dim=-1)
    rows = torch.cat((latent[:, None], k_rope), dim=-1)  # (B, 1, T, r + d_r)
    return query, rows


def latent_output(engine, mla: MlaWeights, attended: torch.Tensor) -> torch.Tensor:
    """Attention-weighted latents (B, H, T, r) -> (B, T, H d_v) through W_uv (absorbed)."""
    b, h, t, _ = attended.shape
    out = engine.num.round_(attended @ mla.w_uv.transpose(-1, -2))  # (B, H, T, d_v)
    return out.transpose(1, 2).reshape(b, t, h * engine.cfg.mla.v_head_dim)


def latent_cache_shape(cfg, batch: int, length: int) -> tuple[int, ...]:
    """(L, B, 1, S, r + d_r): one latent row per token and layer; the values are a
    view of its first r columns (``EngineForward.static_cache``)."""
    m = cfg.mla
    return (cfg.n_layers, batch, 1, length, m.kv_lora_rank + m.qk_rope_head_dim)


def _latent_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm of a latent in fp32 with eps 1e-6 (transformers' DeepSeek norms its
    latents so, whatever rms_norm_eps says); the fused kernel on fp32 storage."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, MLA_NORM_EPS)
    return rms_norm(x, weight, MLA_NORM_EPS)
