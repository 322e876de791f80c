"""Transformer building blocks: RMSNorm, positions, rotary embeddings, masks,
causal self-attention and the dense SwiGLU FFN.

The pure functions here (``positions_from_mask``, ``rotary_cos_sin``,
``apply_rotary``, ``attention_bias_mask``) are the one definition of each
formula; the rollout engine (``trainer.rollout``) calls them too so both
implementations agree on the math and differ only in numerics.

Shapes: B batch, T new tokens, S keys (past + new), D d_model, H heads,
hd head dim.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019), computed in fp32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * weight, statistics in fp32; returns x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def positions_from_mask(attention_mask: torch.Tensor, offset: torch.Tensor | None = None):
    """Position ids from a (B, T) bool mask: ``cumsum(mask) - 1`` clamped at 0.

    A left-padded prompt thus starts at position 0 (docs/trainer-internals.md).
    ``offset`` (B,) is the number of real tokens already in a KV cache.
    """
    pos = attention_mask.long().cumsum(-1) - 1
    if offset is not None:
        pos = pos + offset[:, None]
    return pos.clamp_min(0)


def rope_frequencies(
    head_dim: int, base: float, scaling: Any = None, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """(inv_freq (hd/2,) fp32, attention_scaling) for a ``RopeScalingConfig``.

    The formulas of transformers' ``modeling_rope_utils`` (parity-tested in
    tests/trainer/test_hf_rope.py):

    * linear (Chen et al. 2023, position interpolation): theta_i / factor.
    * dynamic (NTK-aware, /u/emozilla): past ``max_positions`` the base grows to
      base * (factor * S / max_positions - (factor - 1))^(hd / (hd - 2)) for a
      sequence of S positions; within it, plain RoPE.
    * yarn (Peng et al. 2023, arXiv 2309.00071): a linear ramp between
      interpolated (theta_i / factor) and extrapolated (theta_i) frequencies over
      the dims whose wavelength rotates between beta_slow and beta_fast times in
      the pretraining context; cos/sin scaled by 0.1 ln(factor) + 1 (eq. 21).
    * llama3 (Llama 3.1): wavelengths above max_positions / low_freq_factor are
      divided by factor, below max_positions / high_freq_factor kept, smoothly
      interpolated between.
    """
    kind = "default" if scaling is None else scaling.kind
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    if kind == "dynamic" and seq_len is not None and seq_len > scaling.max_positions:
        factor = scaling.factor
        base = base * ((factor * seq_len / scaling.max_positions) - (factor - 1)) ** (
            head_dim / (head_dim - 2)
        )
    inv_freq = 1.0 / base**exponents
    if kind == "linear":
        return inv_freq / scaling.factor, 1.0
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(head_dim, base, scaling)
    return inv_freq, 1.0


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Any) -> torch.Tensor:
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_context = scaling.max_positions
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_inv_freq(head_dim: int, base: float, scaling: Any) -> tuple[torch.Tensor, float]:
    factor = scaling.factor
    attention_factor = scaling.attention_factor
    if attention_factor is None:
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0

    def correction_dim(rotations: float) -> float:
        # the dim whose wavelength fits ``rotations`` times in the pretraining context
        return (head_dim * math.log(scaling.max_positions / (rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    pos_freqs = base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1 = extrapolate (high-frequency dims keep their frequency)
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0):
    """cos, sin of shape (B, 1, T, hd) in fp32 for positions (B, T), times ``scale``
    (YaRN's attention factor; 1 for the other kinds)."""
    angles = positions.float()[..., None] * inv_freq.to(positions.device)  # (B, T, hd/2)
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # (B, 1, T, hd)
    if scale != 1.0:
        return angles.cos() * scale, angles.sin() * scale
    return angles.cos(), angles.sin()


def dynamic_rope_length(positions: torch.Tensor, scaling: Any) -> int | None:
    """The sequence length dynamic NTK scaling grows the base for (max position + 1,
    as transformers' ``dynamic_rope_update``), or None when nothing changes."""
    if scaling is None or scaling.kind != "dynamic":
        return None
    seq_len = int(positions.max()) + 1
    return seq_len if seq_len > scaling.max_positions else None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, hd) by the position angles (rotate-half form, as in Llama).

    cos/sin narrower than x (rd < hd): partial rotary (GLM-4.5's
    partial_rotary_factor), the first rd dims rotate and the rest pass unchanged.
    """
    rd = cos.shape[-1]
    if rd < x.shape[-1]:
        return torch.cat((apply_rotary(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos + rotated * sin).to(x.dtype)


def attention_bias_mask(
    key_valid: torch.Tensor, q_len: int, window: int | None = None
) -> torch.Tensor:
    """Boolean SDPA mask (B, 1, T, S), True = may attend.

    Causal over the last ``q_len`` of the ``S`` keys, AND the key is a real
    token. Every query may also attend to itself so that pad queries (left or
    right padding) still have one key and produce finite (ignored) outputs
    instead of NaN; a real query's own key is real anyway, so this changes
    nothing for real tokens. With ``window`` a query at column q sees only
    keys at columns > q - window (transformers' ``sliding_window_overlay``;
    columns, not position ids, as transformers' cache positions: the same
    distance for the contiguous real tokens of a left-padded row).
    """
    s = key_valid.shape[-1]
    device = key_valid.device
    q_pos = torch.arange(s - q_len, s, device=device)[:, None]  # (T, 1)
    k_pos = torch.arange(s, device=device)[None, :]  # (1, S)
    causal = k_pos <= q_pos
    if window is not None:
        causal = causal & (k_pos > q_pos - window)
    diagonal = k_pos == q_pos
    return (causal & key_valid[:, None, None, :]) | diagonal


class KVCache:
    """Growing per-layer key/value cache for the training model.

    Only used to check incremental decoding against the full forward; the
    rollout engine has its own preallocated static cache.
    """

    def __init__(self, n_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers
        self.mask: torch.Tensor | None = None  # (B, S) real-token mask of cached keys

    @property
    def n_real(self) -> torch.Tensor | None:
        """(B,) count of real tokens already cached (the next position id)."""
        return None if self.mask is None else self.mask.long().sum(-1)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Add (B, H, T, hd) keys/values for one layer; return all cached for it."""
        if self.keys[layer] is not None:
            k = torch.cat((self.keys[layer], k), dim=2)
            v = torch.cat((self.values[layer], v), dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class CausalSelfAttention(nn.Module):
    """Causal attention over F.scaled_dot_product_attention.

    Multi-head by default; with ``n_kv_heads < n_heads`` grouped-query attention
    (Ainslie et al. 2023): key/value head j serves query heads
    [j*g, (j+1)*g), g = n_heads / n_kv_heads, as Hugging Face's ``repeat_kv``.
    q, k and v come from one fused projection ``qkv`` (out rows: H*hd queries,
    then Hkv*hd keys, then Hkv*hd values). ``qk_norm`` adds an RMSNorm on q and
    k before rotary: "head" over each head's hd (Qwen3), "full" over the whole
    projection (OLMoE). ``bias``: "qkv" (Qwen2) or "qkvo" (Llama/Qwen3
    attention_bias). The KV cache stores the Hkv heads only.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        qk_norm: str = "none",
        bias: str = "none",
        norm_eps: float = 1e-5,
        sinks: bool = False,
    ):
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        self.head_dim = head_dim or d_model // n_heads
        self.qk_norm = qk_norm
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.split_sizes = (q_dim, kv_dim, kv_dim)
        self.qkv = nn.Linear(d_model, q_dim + 2 * kv_dim, bias=bias != "none")
        self.proj = nn.Linear(q_dim, d_model, bias=bias == "qkvo")
        self.q_norm = self.k_norm = None
        if qk_norm == "head":
            self.q_norm = RMSNorm(self.head_dim, norm_eps)
            self.k_norm = RMSNorm(self.head_dim, norm_eps)
        elif qk_norm == "full":
            self.q_norm = RMSNorm(q_dim, norm_eps)
            self.k_norm = RMSNorm(kv_dim, norm_eps)
        # GPT-OSS attention sinks: one learned logit per head (``sink_attention``).
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None

    def forward(
        self,
        x: torch.Tensor,
        mask4d: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        kv_cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        """x: (B, T, D); mask4d: (B, 1, T, S) bool; rope: cos, sin (B, 1, T, hd)."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(self.split_sizes, dim=-1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, t, self.n_heads, self.head_dim)
        k = k.view(b, t, self.n_kv_heads, self.head_dim)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, hd), (B, Hkv, T, hd)
        v = v.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if kv_cache is not None:
            k, v = kv_cache.append(layer, k, v)
        k, v = repeat_kv(k, self.n_heads), repeat_kv(v, self.n_heads)
        if self.sinks is not None:
            y = sink_attention(q, k, v, mask4d, self.sinks)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask4d)
        return self.proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


def sink_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask4d: torch.Tensor, sinks: torch.Tensor
) -> torch.Tensor:
    """Softmax attention with a learned sink logit per head (GPT-OSS; Xiao et al. 2023's
    attention sink as a parameter): softmax over [q k^T / sqrt(hd), s_h] and the sink's
    share dropped, so a head may attend to nothing. q (B, H, T, hd), k, v (B, H, S, hd),
    mask4d (B, 1, T, S) bool, sinks (H,). Returns (B, H, T, hd); softmax in fp32."""
    b, h, t, _ = q.shape
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.float().masked_fill(~mask4d, float("-inf"))
    sink = sinks.float().view(1, h, 1, 1).expand(b, h, t, 1)
    weights = torch.cat((scores, sink), dim=-1).softmax(dim=-1)[..., :-1]
    return weights.to(v.dtype) @ v


def repeat_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, Hkv, S, hd) -> (B, H, S, hd): each key/value head repeated for its
    H / Hkv query heads (grouped-query attention); a no-op when Hkv == H."""
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class SwiGLU(nn.Module):
    """Dense FFN: down(silu(x W_gate) * (x W_up)) (Shazeer 2020, arXiv 2002.05202).

    Three plain linears: measured faster than one fused gate|up linear plus a
    chunk (3% at the training shape, 13% at decode; docs/benchmarks.md), since
    the chunk's strided halves cost more than the second GEMM launch saves.
    ``x (..., D) -> (..., D)``.
    """

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.w_gate = nn.Linear(d_model, hidden, bias=False)
        self.w_up = nn.Linear(d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


def init_normal_(module: nn.Module, std: float, residual_std: float) -> None:
    """GPT-2/nanoGPT init: N(0, std), residual projections N(0, std / sqrt(2L))."""
    for name, param in module.named_parameters():
        if param.dim() < 2:
            continue
        is_residual_out = name.endswith(("proj.weight", "w_down.weight", "w_down"))
        nn.init.normal_(param, mean=0.0, std=residual_std if is_residual_out else std)


def residual_std(std: float, n_layers: int) -> float:
    return std / math.sqrt(2 * n_layers)
