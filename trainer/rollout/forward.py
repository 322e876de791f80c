"""The rollout engine's forward: prefill and cached decode over its own weights.

The same formulas as the training model (``trainer.model.layers``: positions,
rotary angles, the attention mask; ``trainer.model.dispatch``: the grouped
expert matmul), computed with the engine's numerics and a preallocated static
KV cache, so the numbers differ the way an inference engine's do. One part of
``RolloutEngine``, which owns it: it reads the engine's weights
(``trainer.rollout.weights.EngineWeights``) and keeps the KV cache, the rotary
table and the dispatch's slot index between calls.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from trainer.config import ModelConfig
from trainer.model.layers import (
    apply_rotary,
    attention_bias_mask,
    dynamic_rope_length,
    repeat_kv,
    rms_norm,
    rope_frequencies,
    rotary_cos_sin,
    sink_attention,
)
from trainer.model.mla import mla_softmax_scale
from trainer.rollout.experts import EngineMoE, swiglu
from trainer.rollout.mla import latent_cache_shape, latent_output, latent_rows
from trainer.rollout.router_noise import RouterNoise
from trainer.rollout.weights import EngineLayer, EngineWeights


class EngineForward:
    """Prefill (``forward``) and one-token decode (``decode``) over ``weights.layers``.

    cfg: the model's shape; weights: the engine's weights (filled by each sync);
    moe_backend: the expert GEMMs' backend (``trainer.model.dispatch``);
    router_noise: the routing-only dose, or None.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        weights: EngineWeights,
        moe_backend: str = "auto",
        router_noise: RouterNoise | None = None,
    ):
        self.cfg = cfg
        self.weights = weights
        self.num = weights.num
        self.device = weights.device
        self.moe = EngineMoE(cfg, weights, moe_backend, router_noise)
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.resolved_n_kv_heads
        self.head_dim = cfg.resolved_head_dim
        kv_dim = self.n_kv_heads * self.head_dim
        self.qkv_split = (self.n_heads * self.head_dim, kv_dim, kv_dim)
        # Rotary covers the first rotary_dim of each head (all of it but under partial
        # rotary; the rope part of a latent-attention head).
        self.rotary_dim = cfg.resolved_rotary_dim
        self.attn_scale = mla_softmax_scale(cfg) if cfg.mla.enabled else self.head_dim**-0.5
        # The decode fast path rotates q and k as one (B, 2, H, hd) view; it
        # needs as many key as query heads, no per-tensor q/k norm, whole-head rotary.
        self.joint_qk = (
            self.n_kv_heads == self.n_heads
            and cfg.qk_norm == "none"
            and self.rotary_dim == self.head_dim
            and not cfg.mla.enabled
        )
        inv_freq, self.rope_scale = rope_frequencies(
            self.rotary_dim, cfg.rope_theta, cfg.rope_scaling
        )
        self.inv_freq = inv_freq.to(self.device)
        # Kept between calls: (keys, values) cache buffers, one tensor per layer each,
        # the (S, 2, hd) rotary table (static_decode marks them static).
        self.cache: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self.rope: torch.Tensor | None = None

    def static_cache(self, batch: int, length: int):
        """Preallocated key and value buffers, one (B, Hkv, S, hd) tensor per layer
        each, reused across calls.

        Latent attention caches one (B, 1, S, r + d_r) buffer of latent rows per
        layer; its values are a view of the rows' first r columns
        (``trainer.rollout.mla``). One tensor per layer, not one (L, ...) stack: a
        compiled step writes layer i's column in place (``index_copy_``), and
        inductor turns an in-place write into a view of a graph input into a copy
        of the whole input and a copy back (its generated code for the stacked
        cache copied the whole cache every step); a write into a whole input it
        keeps in place, as transformers' StaticCache (one tensor per layer) relies on."""
        if self.cfg.mla.enabled:
            shape = latent_cache_shape(self.cfg, batch, length)[1:]
        else:
            shape = (batch, self.n_kv_heads, length, self.head_dim)
        cache = self.cache
        if cache is None or cache[0][0].shape[0] != batch or cache[0][0].shape[2] < length:
            keys = [
                torch.empty(shape, dtype=self.num.dtype, device=self.device)
                for _ in range(self.cfg.n_layers)
            ]
            if self.cfg.mla.enabled:
                values = [k[..., : self.cfg.mla.kv_lora_rank] for k in keys]
            else:
                values = [torch.empty_like(k) for k in keys]
            self.cache = (keys, values)
        return self.cache

    def rope_table(self, length: int) -> torch.Tensor:
        """(S, 2, hd) fp32: cos and sign-folded sin for positions 0..S-1, grown on demand.

        cos[p] equals ``rotary_cos_sin`` at position p bit for bit (same
        elementwise formula). The sin row has its first half negated so that
        rotate_half(x) * sin == roll(x, hd / 2) * sin_signed exactly (IEEE
        products are sign-symmetric): one lookup and one roll per decode step
        instead of recomputing the angles and a neg + cat.
        """
        if self.rope is None or self.rope.shape[0] < length:
            positions = torch.arange(length, device=self.device)[None]
            cos, sin = (t[0, 0] for t in rotary_cos_sin(positions, self.inv_freq, self.rope_scale))
            half = self.rotary_dim // 2
            sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
            self.rope = torch.stack((cos, sin), dim=1)
        return self.rope

    def _inv_freq_for(self, positions: torch.Tensor) -> torch.Tensor:
        """Rotary frequencies for these positions: fixed, except dynamic NTK scaling
        past its context (recomputed for max position + 1, as transformers)."""
        seq_len = dynamic_rope_length(positions, self.cfg.rope_scaling)
        if seq_len is None:
            return self.inv_freq
        inv_freq, _ = rope_frequencies(
            self.rotary_dim, self.cfg.rope_theta, self.cfg.rope_scaling, seq_len
        )
        return inv_freq.to(self.device)

    def _decode_angles(self, position: torch.Tensor) -> torch.Tensor:
        """(B, 2, hd) cos and sign-folded sin for the decode positions (B,): rows of
        ``rope_table``, or computed afresh where dynamic NTK scaling grows the base."""
        if dynamic_rope_length(position, self.cfg.rope_scaling) is None:
            return self.rope[position]
        cos, sin = rotary_cos_sin(position[:, None], self._inv_freq_for(position))
        cos, sin = cos[:, 0, 0], sin[:, 0, 0]  # (B, hd)
        half = self.rotary_dim // 2
        sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        return torch.stack((cos, sin), dim=1)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm in fp32. With fp32 storage the fused ``F.rms_norm`` kernel
        (one op instead of six) computes the same formula as ``rms_norm``."""
        if x.dtype == torch.float32 and weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), weight, self.cfg.norm_eps)
        return rms_norm(x, weight, self.cfg.norm_eps)

    def _linear_bias(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None):
        """x @ w.T (+ bias), each result stored at the engine's precision."""
        y = self.num.linear(x, w)
        return y if bias is None else self.num.round_(y + bias)

    def _qkv(self, h: torch.Tensor, layer: EngineLayer, b: int, t: int):
        """Stored activations h (B, T, D) -> q (B, T, H, hd), k, v (B, T, Hkv, hd),
        q and k normed when the layer has q/k norm (before rotary, as in HF)."""
        q, k, v = self._linear_bias(h, layer.wqkv, layer.qkv_bias).split(self.qkv_split, dim=-1)
        full = self.cfg.qk_norm == "full"
        if full:
            q = self.num.round_(self._norm(q, layer.q_norm))
            k = self.num.round_(self._norm(k, layer.k_norm))
        q = q.reshape(b, t, self.n_heads, self.head_dim)
        k = k.reshape(b, t, self.n_kv_heads, self.head_dim)
        v = v.reshape(b, t, self.n_kv_heads, self.head_dim)
        if layer.q_norm is not None and not full:
            q = self.num.round_(self._norm(q, layer.q_norm))
            k = self.num.round_(self._norm(k, layer.k_norm))
        return q, k, v

    def _latent_prefill(self, layer, h, rope, cache, cache_start, i, mask4d) -> torch.Tensor:
        """Latent attention over new tokens h (B, T, D) (``trainer.rollout.mla``): their
        latent rows written to the cache at [cache_start, cache_start + T) when there is
        one; returns the (B, T, H d_v) attention output before W_o."""
        query, rows = latent_rows(self, layer.mla, h, lambda z: apply_rotary(z, *rope))
        keys = rows
        if cache is not None:
            end = cache_start + rows.shape[2]
            cache[0][i][:, :, cache_start:end] = rows
            keys = cache[0][i][:, :, :end]
        values = keys[..., : self.cfg.mla.kv_lora_rank]
        # Multi-query attention over the latent: one key/value head for the H queries.
        attended = F.scaled_dot_product_attention(
            query,
            keys.expand(-1, self.n_heads, -1, -1),
            values.expand(-1, self.n_heads, -1, -1),
            attn_mask=mask4d,
            scale=self.attn_scale,
        )
        return latent_output(self, layer.mla, self.num.round_(attended))

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        key_valid: torch.Tensor,
        cache_start: int | None,
        routing_out: torch.Tensor | None,
        all_positions: bool = False,
    ) -> torch.Tensor:
        """One forward over new tokens (B, T) at ``positions`` (B, T): the
        prefill, ``score`` and the full-recompute benchmark path.

        key_valid: (B, S) real-token mask of all keys up to and including the
        new tokens. With ``cache_start`` the new keys/values are written to the
        static cache at columns [cache_start, cache_start + T) and attention
        reads columns [0, cache_start + T); without it, T == S (full recompute).
        routing_out: (L_moe, B, T, k) buffer for the natural top-k, or None.
        Returns fp32 logits of the last position (B, V), or of every position
        (B, T, V) with ``all_positions``.
        """
        num = self.num
        b, t = tokens.shape
        d = self.cfg.d_model
        x = self.weights.tok_emb[tokens]  # rows of a stored (rounded-at-load) table
        rope = None
        if self.weights.pos_emb is not None:
            x = num.round_(x + self.weights.pos_emb[positions])
        else:
            rope = rotary_cos_sin(positions, self._inv_freq_for(positions), self.rope_scale)
        mask4d = attention_bias_mask(key_valid, t)
        window = self.cfg.sliding_window
        slide4d = attention_bias_mask(key_valid, t, window) if window is not None else None
        cache = self.cache if cache_start is not None else None
        moe_i = 0
        for i, layer in enumerate(self.weights.layers):
            h = num.round_(self._norm(x, layer.attn_norm))
            mask_i = slide4d if self.cfg.uses_sliding_window(i) else mask4d
            if layer.mla is not None:
                y = self._latent_prefill(layer, h, rope, cache, cache_start, i, mask_i)
                x = num.round_(x + num.linear(y, layer.wo))
            else:
                q, k, v = (z.transpose(1, 2) for z in self._qkv(h, layer, b, t))
                if rope is not None:
                    q, k = num.round_(apply_rotary(q, *rope)), num.round_(apply_rotary(k, *rope))
                if cache is not None:
                    end = cache_start + t
                    cache[0][i][:, :, cache_start:end] = k
                    cache[1][i][:, :, cache_start:end] = v
                    k, v = cache[0][i][:, :, :end], cache[1][i][:, :, :end]
                k, v = repeat_kv(k, self.n_heads), repeat_kv(v, self.n_heads)
                y = num.round_(_attention(q, k, v, mask_i, layer.sinks))
                y = y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)
                x = num.round_(x + self._linear_bias(y, layer.wo, layer.wo_bias))

            h = num.round_(self._norm(x, layer.ffn_norm))
            if layer.is_moe:
                y, top = self.moe(h.view(b * t, d), layer)
                y = y.view(b, t, d)
                if routing_out is not None:
                    routing_out[moe_i] = top.view(b, t, -1)
                moe_i += 1
            else:
                y = swiglu(self.num, h, layer.w_gate, layer.w_up, layer.w_down)
            x = num.round_(x + y)
        h = num.round_(self._norm(x if all_positions else x[:, -1], self.weights.norm_f))
        return num.linear(h, self.weights.lm_head, fp8=False).float()

    def _attend_one(self, q, keys, values, bias, sinks, n_kv: int, groups: int) -> torch.Tensor:
        """One query per row over the cache, by hand: for one query SDPA's blocked CPU
        kernel costs more than these few small ops. Grouped-query: the g query heads
        of key head j are rows of one (g, hd) @ (hd, S) product. q (B, H, hd); keys
        (B, Hkv, S, hd), values (B, Hkv, S, d_v); bias broadcastable to (B, Hkv, g, S);
        sinks (H,) or None. Returns the stored (B, Hkv, g, d_v)."""
        b = q.shape[0]
        q = q.reshape(b, n_kv, groups, q.shape[-1])
        scores = (q @ keys.transpose(-1, -2)) * self.attn_scale  # (B, Hkv, g, S)
        logits = scores.float() + bias
        if sinks is None:
            weights = logits.softmax(-1)
        else:  # GPT-OSS: a per-head sink logit joins the softmax, its share dropped
            sink = sinks.view(1, n_kv, groups, 1).expand(b, n_kv, groups, 1)
            weights = torch.cat((logits, sink), dim=-1).softmax(-1)[..., :-1]
        return self.num.round_(weights.to(values.dtype) @ values)

    def _latent_decode(self, layer, h, cos, sin, kv, i: int) -> torch.Tensor:
        """One decode step of latent attention (``trainer.rollout.mla``): h (B, D) ->
        the (B, H d_v) output before W_o; the new latent row goes through ``kv``."""
        b = h.shape[0]
        r = self.cfg.mla.kv_lora_rank

        def rotate(z: torch.Tensor) -> torch.Tensor:
            return _rotate(z, cos, sin, self.rotary_dim)

        query, rows = latent_rows(self, layer.mla, h[:, None], rotate)
        keys, values, bias = kv(i, rows[:, :, 0], rows[:, :, 0, :r])
        attended = self._attend_one(query[:, :, 0], keys, values, bias, None, 1, self.n_heads)
        return latent_output(self, layer.mla, attended.view(b, self.n_heads, 1, r))[:, 0]

    def decode(
        self,
        token: torch.Tensor,
        position: torch.Tensor,
        col: int,
        key_bias: torch.Tensor,
        routing_out: torch.Tensor | None,
    ) -> torch.Tensor:
        """One cached decode step: the same math as ``forward`` with T == 1,
        written for the fewest ops (decode is bound by per-op overhead).

        token, position: (B,) the token fed at cache column ``col`` and its
        position id. key_bias: (B, 1, 1, col + 1) fp32 additive mask, 0 where
        the query may attend and -inf elsewhere (adding 0 or -inf gives
        exactly what ``masked_fill`` gives). routing_out: (L_moe, B, k) view
        for the natural top-k, or None. Returns fp32 logits (B, V).

        The cache is read up to column ``col`` (a slice that grows per token);
        ``trainer.rollout.static_decode`` runs the same loop over a fixed-width
        bucket of the cache for a compiler or a CUDA graph.
        """
        keys, values = self.cache
        end = col + 1
        slide_bias = None
        if self.cfg.sliding_window is not None:
            # transformers' sliding window: a query at column q sees columns > q - window
            slide_bias = key_bias.clone()
            slide_bias[..., : max(0, end - self.cfg.sliding_window)] = float("-inf")

        def kv(i: int, k: torch.Tensor, v: torch.Tensor):
            keys[i][:, :, col] = k
            values[i][:, :, col] = v
            bias = slide_bias if self.cfg.uses_sliding_window(i) else key_bias
            return keys[i][:, :, :end], values[i][:, :, :end], bias

        def store_routing(moe_i: int, top: torch.Tensor) -> None:
            routing_out[moe_i] = top

        return self.decode_layers(
            token, position, kv, None if routing_out is None else store_routing
        )

    def decode_layers(
        self,
        token: torch.Tensor,
        position: torch.Tensor,
        kv: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]],
        store_routing: Callable[[int, torch.Tensor], None] | None,
    ) -> torch.Tensor:
        """The decode step's layers for one new token per row; fp32 logits (B, V).

        kv(i, k, v): writes layer i's new key and value (B, Hkv, hd) into the cache
        and returns what the query attends over: keys, values (B, Hkv, S, hd) and
        the additive bias broadcastable to (B, Hkv, g, S). store_routing(m, top):
        records MoE layer m's natural top-k (B, k).
        """
        num = self.num
        b = token.shape[0]
        n_heads, n_kv, head_dim = self.n_heads, self.n_kv_heads, self.head_dim
        rd = self.rotary_dim
        groups = n_heads // n_kv
        x = self.weights.tok_emb[token]  # (B, D), rows of a stored table
        cos = sin = None
        if self.weights.pos_emb is not None:
            x = num.round_(x + self.weights.pos_emb[position])
        else:
            angles = self._decode_angles(position)  # (B, 2, rd)
            cos = angles[:, 0].view(b, 1, 1, rd)
            sin = angles[:, 1].view(b, 1, 1, rd)
        moe_i = 0
        for i, layer in enumerate(self.weights.layers):
            h = num.round_(self._norm(x, layer.attn_norm))
            if layer.mla is not None:
                y = self._latent_decode(layer, h, cos, sin, kv, i)
                x = num.round_(x + num.linear(y, layer.wo))
            else:
                if self.joint_qk:
                    qkv = self._linear_bias(h, layer.wqkv, layer.qkv_bias)
                    qkv = qkv.view(b, 3, n_heads, head_dim)
                    qk = qkv[:, :2]  # (B, 2, H, hd): query and key rotated together
                    if cos is not None:
                        qk = num.round_(_rotate(qk, cos, sin, rd))
                    q, k, v = qk[:, 0], qk[:, 1], qkv[:, 2]
                else:
                    q, k, v = (z[:, 0] for z in self._qkv(h[:, None], layer, b, 1))
                    if cos is not None:
                        q = num.round_(_rotate(q, cos[:, 0], sin[:, 0], rd))
                        k = num.round_(_rotate(k, cos[:, 0], sin[:, 0], rd))
                keys, values, bias = kv(i, k, v)
                y = self._attend_one(q, keys, values, bias, layer.sinks, n_kv, groups)
                x = num.round_(x + self._linear_bias(y.view(b, -1), layer.wo, layer.wo_bias))

            h = num.round_(self._norm(x, layer.ffn_norm))
            if layer.is_moe:
                y, top = self.moe(h, layer)
                if store_routing is not None:
                    store_routing(moe_i, top)
                moe_i += 1
            else:
                y = swiglu(self.num, h, layer.w_gate, layer.w_up, layer.w_down)
            x = num.round_(x + y)
        h = num.round_(self._norm(x, self.weights.norm_f))
        return num.linear(h, self.weights.lm_head, fp8=False).float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int):
    """Rotary on the first ``rotary_dim`` of (..., hd) with the sign-folded sin table
    (``rope_table``), in fp32; the other dims pass (partial rotary, GLM-4.5)."""
    if x.shape[-1] > rotary_dim:
        rotated = _rotate(x[..., :rotary_dim], cos, sin, rotary_dim)
        return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)
    xf = x.float()
    return (xf * cos + xf.roll(rotary_dim // 2, dims=-1) * sin).to(x.dtype)


def _attention(q, k, v, mask4d, sinks=None):
    """Softmax attention (with GPT-OSS's per-head sink logits when ``sinks`` (H,) is
    given: ``trainer.model.layers.sink_attention``). One query per row (decode) is done
    by hand: for a single query SDPA's blocked CPU kernel costs more than three small ops."""
    if sinks is not None:
        return sink_attention(q, k, v, mask4d, sinks)
    if q.shape[2] > 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask4d)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    weights = scores.float().masked_fill(~mask4d, float("-inf")).softmax(-1)
    return weights.to(v.dtype) @ v
