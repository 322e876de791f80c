"""The rollout engine: a separate inference implementation of the policy.

Like vLLM next to Megatron, it has its own weight layout (fused gate|up
expert weights), its own forward with a preallocated static KV cache, and its
own precision (``trainer.rollout.numerics``). Every RL step it receives the
training model's ``state_dict()`` (``load_weights``), samples responses, and
records each token's log-prob and each MoE layer's natural top-k experts.

It shares with the training model only the definitions of the formulas
(positions, rotary angles, the attention mask, the grouped-matmul kernel);
the numerics differ, which is the training-inference mismatch under study.

    engine = RolloutEngine(cfg.model, vocab_size, precision="bf16", device=dev)
    engine.load_weights(model.state_dict())
    batch = engine.generate(prompt_tokens, prompt_mask, max_new_tokens=16, ...)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer.config import ModelConfig
from trainer.model.dispatch import Dispatch, expert_counts, expert_matmul, resolve_backend
from trainer.model.expert_parallel import all_finished, run_on_owners
from trainer.model.layers import (
    apply_rotary,
    attention_bias_mask,
    dynamic_rope_length,
    positions_from_mask,
    repeat_kv,
    rms_norm,
    rope_frequencies,
    rotary_cos_sin,
)
from trainer.rollout.numerics import Numerics
from trainer.rollout.router_noise import RouterNoise
from trainer.rollout.routing_pack import PackedRouting, index_dtype
from trainer.rollout.sampling import (
    replay_draws,
    sample_next,
    sampling_stream,
    scaled_logprobs,
)


@dataclass
class RolloutBatch:
    """Sampled sequences in the shared batch layout (docs/trainer-internals.md).

    tokens, attention_mask, response_mask: (B, T); logprobs: (B, T) fp32, the
    engine's log-prob of every prompt and response token (0 at the first real
    token and on pads); routing: natural top-k per MoE layer, or None for a
    dense model; prompt_len: P, the padded prompt width.
    """

    tokens: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    routing: PackedRouting | None
    prompt_len: int

    @property
    def routing_mask(self) -> torch.Tensor | None:
        return None if self.routing is None else self.routing.routing_mask


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    wqkv: torch.Tensor  # ((H + 2 Hkv) hd, D): queries, keys, values
    wo: torch.Tensor  # (D, H hd)
    ffn_norm: torch.Tensor
    # Hugging Face attention features (docs/models.md); None when absent
    qkv_bias: torch.Tensor | None = None  # ((H + 2 Hkv) hd,)
    wo_bias: torch.Tensor | None = None  # (D,)
    q_norm: torch.Tensor | None = None  # (hd,) or (H hd,) per cfg.qk_norm
    k_norm: torch.Tensor | None = None  # (hd,) or (Hkv hd,)
    # dense FFN
    w_gate: torch.Tensor | None = None  # (H, D)
    w_up: torch.Tensor | None = None  # (H, D)
    w_down: torch.Tensor | None = None  # (D, H)
    # MoE
    router: torch.Tensor | None = None  # (E, D)
    selection_bias: torch.Tensor | None = None  # (E,) fp32
    router_temperature: float = 1.0
    experts_gate_up: torch.Tensor | None = None  # (E, D, 2H) fused for one grouped matmul
    experts_down: torch.Tensor | None = None  # (E, H, D)
    shared_gate: torch.Tensor | None = None
    shared_up: torch.Tensor | None = None
    shared_down: torch.Tensor | None = None
    shared_expert_gate: torch.Tensor | None = None  # (1, D): sigmoid gate of the shared expert
    # Precomputed at load so the per-token router skips exact no-ops
    # (x / 1.0 and x + 0.0 change no value and no top-k order).
    has_temperature: bool = False
    has_selection_bias: bool = False
    moe_index: int = -1  # position among the MoE layers (router noise, routing buffers)

    @property
    def is_moe(self) -> bool:
        return self.router is not None


class RolloutEngine:
    def __init__(
        self,
        cfg: ModelConfig,
        vocab_size: int,
        precision: str = "bf16",
        device: torch.device | str = "cpu",
        moe_backend: str = "auto",
        router_noise: RouterNoise | None = None,
        stop_check_every: int = 8,
    ):
        if stop_check_every < 1:
            raise ValueError(f"stop_check_every must be >= 1, not {stop_check_every}")
        self.cfg = cfg
        # The routing-only dose (trainer.rollout.router_noise): None or sigma 0 = off.
        self.router_noise = router_noise if router_noise and router_noise.active else None
        self.vocab_size = vocab_size
        self.num = Numerics(precision, device)
        self.device = self.num.device
        self.moe_backend = moe_backend
        # Decode steps between two checks whether every row stopped: the check
        # reads a flag on the host (a sync); between checks the loop runs on
        # without waiting (``_sample``).
        self.stop_check_every = stop_check_every
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.resolved_n_kv_heads
        self.head_dim = cfg.resolved_head_dim
        kv_dim = self.n_kv_heads * self.head_dim
        self.qkv_split = (self.n_heads * self.head_dim, kv_dim, kv_dim)
        # The decode fast path rotates q and k as one (B, 2, H, hd) view; it
        # needs as many key as query heads and no per-tensor q/k norm.
        self.joint_qk = self.n_kv_heads == self.n_heads and cfg.qk_norm == "none"
        inv_freq, self.rope_scale = rope_frequencies(
            self.head_dim, cfg.rope_theta, cfg.rope_scaling
        )
        self.inv_freq = inv_freq.to(self.device)
        self.layers: list[_Layer] = []
        self.loaded = False
        self._cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self._rope: torch.Tensor | None = None
        self._slots: torch.Tensor | None = None
        # Expert parallelism (trainer.model.expert_parallel): this rank holds the
        # experts of ``expert_shard`` only; load_weights then takes those slices and
        # every MoE layer sends its rows to their experts' rank and back.
        self.expert_shard = None

    @property
    def precision(self) -> str:
        return self.num.precision

    @property
    def n_moe_layers(self) -> int:
        return self.cfg.n_moe_blocks

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Take the training model's ``state_dict()``: round once to this
        engine's precision and re-lay out (fuse the experts' gate|up)."""
        w, g = self.num.weight, self.num.gemm_weight  # g: projection GEMMs (e4m3 under fp8)
        sd = state_dict
        self.tok_emb = w(sd["tok_emb.weight"])
        self.pos_emb = w(sd["pos_emb.weight"]) if self.cfg.positional == "learned" else None
        self.norm_f = w(sd["norm_f.weight"])
        head = sd["tok_emb.weight"] if self.cfg.tie_embeddings else sd["lm_head.weight"]
        self.lm_head = w(head)
        previous, self.layers = self.layers, []
        for i in range(self.cfg.n_layers):
            p = f"blocks.{i}."
            layer = _Layer(
                attn_norm=w(sd[p + "attn_norm.weight"]),
                wqkv=g(sd[p + "attn.qkv.weight"]),
                wo=g(sd[p + "attn.proj.weight"]),
                ffn_norm=w(sd[p + "ffn_norm.weight"]),
            )
            self._load_attention_extras(layer, sd, p)
            if p + "ffn.router.weight" in sd:
                layer.moe_index = sum(prev.is_moe for prev in self.layers)
                layer.router = w(sd[p + "ffn.router.weight"])
                layer.selection_bias = sd[p + "ffn.router.selection_bias"].to(
                    self.device, torch.float32
                )
                layer.router_temperature = float(sd[p + "ffn.router.temperature"])
                layer.has_temperature = layer.router_temperature != 1.0
                layer.has_selection_bias = bool(layer.selection_bias.any())
                gate, up = sd[p + "ffn.experts.w_gate"], sd[p + "ffn.experts.w_up"]
                if self.num.fp8:
                    # One fp8 scale per expert for gate and for up (two checkpoint tensors),
                    # then fused.
                    layer.experts_gate_up = torch.cat((g(gate), g(up)), dim=2)
                else:
                    layer.experts_gate_up = self._fused_gate_up(
                        previous[i].experts_gate_up if i < len(previous) else None, gate, up
                    )
                layer.experts_down = g(sd[p + "ffn.experts.w_down"])
                if p + "ffn.shared.w_gate.weight" in sd:
                    layer.shared_gate = g(sd[p + "ffn.shared.w_gate.weight"])
                    layer.shared_up = g(sd[p + "ffn.shared.w_up.weight"])
                    layer.shared_down = g(sd[p + "ffn.shared.w_down.weight"])
                if p + "ffn.shared_gate.weight" in sd:
                    layer.shared_expert_gate = w(sd[p + "ffn.shared_gate.weight"])
            else:
                layer.w_gate = g(sd[p + "ffn.w_gate.weight"])
                layer.w_up = g(sd[p + "ffn.w_up.weight"])
                layer.w_down = g(sd[p + "ffn.w_down.weight"])
            self.layers.append(layer)
        self.loaded = True

    def _fused_gate_up(
        self, buffer: torch.Tensor | None, gate: torch.Tensor, up: torch.Tensor
    ) -> torch.Tensor:
        """The experts' gate|up weights fused on the last dim, ``(E, D, 2H)``, in the
        engine's storage. The previous sync's buffer is refilled in place when it
        fits: no new (E, D, 2H) allocation and no fp32 temporary per step, only
        the copy (and rounding) the precision needs. The bits equal
        ``weight(cat(gate, up))``: emulated half rounds through a half-size
        temporary exactly as ``Numerics.round`` does."""
        e, d, h = gate.shape
        num = self.num
        if buffer is None or buffer.shape != (e, d, 2 * h) or buffer.dtype != num.dtype:
            buffer = torch.empty(e, d, 2 * h, dtype=num.dtype, device=self.device)
        for half, src in ((buffer[..., :h], gate), (buffer[..., h:], up)):
            src = src.detach()
            half.copy_(src.to(num.half) if num.emulated else src)
        return buffer

    def _load_attention_extras(self, layer: _Layer, sd: dict[str, torch.Tensor], p: str) -> None:
        """Biases and q/k norms of the Hugging Face families (absent in the builtin model)."""
        w = self.num.weight
        get = sd.get
        if get(p + "attn.qkv.bias") is not None:
            layer.qkv_bias = w(sd[p + "attn.qkv.bias"])
        if get(p + "attn.proj.bias") is not None:
            layer.wo_bias = w(sd[p + "attn.proj.bias"])
        if get(p + "attn.q_norm.weight") is not None:
            layer.q_norm = w(sd[p + "attn.q_norm.weight"])
            layer.k_norm = w(sd[p + "attn.k_norm.weight"])

    # ------------------------------------------------------------------ forward
    def _static_cache(self, batch: int, length: int):
        """Preallocated (L, B, Hkv, S, hd) key and value buffers, reused across calls."""
        shape = (self.cfg.n_layers, batch, self.n_kv_heads, length, self.head_dim)
        if (
            self._cache is None
            or self._cache[0].shape[:2] != shape[:2]
            or (self._cache[0].shape[3] < length)
        ):
            self._cache = (
                torch.empty(shape, dtype=self.num.dtype, device=self.device),
                torch.empty(shape, dtype=self.num.dtype, device=self.device),
            )
        return self._cache

    def _rope_table(self, length: int) -> torch.Tensor:
        """(S, 2, hd) fp32: cos and sign-folded sin for positions 0..S-1, grown on demand.

        cos[p] equals ``rotary_cos_sin`` at position p bit for bit (same
        elementwise formula). The sin row has its first half negated so that
        rotate_half(x) * sin == roll(x, hd / 2) * sin_signed exactly (IEEE
        products are sign-symmetric): one lookup and one roll per decode step
        instead of recomputing the angles and a neg + cat.
        """
        if self._rope is None or self._rope.shape[0] < length:
            positions = torch.arange(length, device=self.device)[None]
            cos, sin = (t[0, 0] for t in rotary_cos_sin(positions, self.inv_freq, self.rope_scale))
            half = self.head_dim // 2
            sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
            self._rope = torch.stack((cos, sin), dim=1)
        return self._rope

    def _inv_freq_for(self, positions: torch.Tensor) -> torch.Tensor:
        """Rotary frequencies for these positions: fixed, except dynamic NTK scaling
        past its context (recomputed for max position + 1, as transformers)."""
        seq_len = dynamic_rope_length(positions, self.cfg.rope_scaling)
        if seq_len is None:
            return self.inv_freq
        inv_freq, _ = rope_frequencies(
            self.head_dim, self.cfg.rope_theta, self.cfg.rope_scaling, seq_len
        )
        return inv_freq.to(self.device)

    def _decode_angles(self, position: torch.Tensor) -> torch.Tensor:
        """(B, 2, hd) cos and sign-folded sin for the decode positions (B,): rows of
        ``_rope_table``, or computed afresh where dynamic NTK scaling grows the base."""
        if dynamic_rope_length(position, self.cfg.rope_scaling) is None:
            return self._rope[position]
        cos, sin = rotary_cos_sin(position[:, None], self._inv_freq_for(position))
        cos, sin = cos[:, 0, 0], sin[:, 0, 0]  # (B, hd)
        half = self.head_dim // 2
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

    def _qkv(self, h: torch.Tensor, layer: _Layer, b: int, t: int):
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

    def _swiglu(
        self, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
    ) -> torch.Tensor:
        """Dense SwiGLU as the trainer's (three plain linears, the faster layout)."""
        gate, up = self.num.linear(x, w_gate), self.num.linear(x, w_up)
        return self.num.linear(self.num.round_(F.silu(gate).mul_(up)), w_down)

    def _dispatch(self, top: torch.Tensor, n_experts: int) -> Dispatch:
        """Assignments (N, k) sorted by expert: the same order as
        ``Dispatch.from_indices`` (a stable sort by expert id keeps the slot
        order within an expert) in fewer ops."""
        flat = top.view(-1)
        n = flat.numel()
        if self._slots is None or self._slots.numel() < n:
            self._slots = torch.arange(n, device=flat.device)
        slots = self._slots[:n]
        order = torch.argsort(flat, stable=True)
        # Counts by search in the sorted ids: bincount syncs on CUDA.
        counts, offsets = expert_counts(flat.index_select(0, order), n_experts)
        return Dispatch(
            order=order,
            inverse=torch.empty_like(order).scatter_(0, order, slots),
            token=order.div(top.shape[-1], rounding_mode="floor"),
            counts=counts,
            offsets=offsets,
        )

    def _moe(self, x: torch.Tensor, layer: _Layer) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (N, D) stored activations -> (y (N, D), natural top-k (N, k))."""
        num = self.num
        # Router input is the stored (half) activation; logits come out of a
        # half GEMM, then temperature and softmax in fp32.
        logits = num.linear(x, layer.router, fp8=False).float()
        if layer.has_temperature:
            logits = logits / layer.router_temperature
        probs = logits.softmax(dim=-1)
        scores = logits + layer.selection_bias if layer.has_selection_bias else logits
        if self.router_noise is not None:
            # Only the choice moves; the gates below read the unperturbed probs.
            scores = self.router_noise.perturb(scores, x, layer.moe_index)
        top = scores.topk(self.cfg.top_k, dim=-1).indices
        picked = probs.gather(-1, top)
        gates = picked / picked.sum(-1, keepdim=True) if self.cfg.norm_topk_prob else picked

        shard = self.expert_shard
        dispatch = self._dispatch(top, shard.n_experts if shard else layer.experts_gate_up.shape[0])
        backend = resolve_backend(self.moe_backend, x)
        xs = num.gemm_input(x.index_select(0, dispatch.token))

        def experts(rows: torch.Tensor, groups: Dispatch) -> torch.Tensor:
            gate, up = num.round_(
                expert_matmul(rows, layer.experts_gate_up, groups, backend)
            ).chunk(2, dim=-1)
            hidden = num.gemm_input(num.round_(F.silu(gate).mul_(up)))
            return num.round_(expert_matmul(hidden, layer.experts_down, groups, backend))

        ys = (
            experts(xs, dispatch)
            if shard is None
            else run_on_owners(xs, dispatch.counts, shard, experts)
        )
        n, k = top.shape
        per_token = ys.index_select(0, dispatch.inverse).view(n, k, -1)
        # Gate-weighted sum over the k slots. In fp32, multiply-then-sum gives
        # the same bits as the training layer's (1, k) @ (k, D) bmm (no fused
        # multiply-add there either) at a third of the cost for small batches;
        # half-precision storage keeps the bmm and its fp32 accumulation.
        if ys.dtype == torch.float32:
            y = (gates[:, :, None] * per_token).sum(1)
        else:
            y = torch.bmm(gates.to(ys.dtype)[:, None, :], per_token).squeeze(1)
        if layer.shared_gate is not None:
            shared = self._swiglu(x, layer.shared_gate, layer.shared_up, layer.shared_down)
            if layer.shared_expert_gate is not None:
                shared = num.round_(
                    torch.sigmoid(num.linear(x, layer.shared_expert_gate, fp8=False)) * shared
                )
            y = y + shared
        return num.round_(y), top

    def _forward(
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
        x = self.tok_emb[tokens]  # rows of a stored (rounded-at-load) table
        rope = None
        if self.pos_emb is not None:
            x = num.round_(x + self.pos_emb[positions])
        else:
            rope = rotary_cos_sin(positions, self._inv_freq_for(positions), self.rope_scale)
        mask4d = attention_bias_mask(key_valid, t)
        window = self.cfg.sliding_window
        slide4d = attention_bias_mask(key_valid, t, window) if window is not None else None
        cache = self._cache if cache_start is not None else None
        moe_i = 0
        for i, layer in enumerate(self.layers):
            h = num.round_(self._norm(x, layer.attn_norm))
            q, k, v = (z.transpose(1, 2) for z in self._qkv(h, layer, b, t))
            if rope is not None:
                q, k = num.round_(apply_rotary(q, *rope)), num.round_(apply_rotary(k, *rope))
            if cache is not None:
                end = cache_start + t
                cache[0][i, :, :, cache_start:end] = k
                cache[1][i, :, :, cache_start:end] = v
                k, v = cache[0][i, :, :, :end], cache[1][i, :, :, :end]
            k, v = repeat_kv(k, self.n_heads), repeat_kv(v, self.n_heads)
            y = num.round_(
                _attention(q, k, v, slide4d if self.cfg.uses_sliding_window(i) else mask4d)
            )
            y = y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)
            x = num.round_(x + self._linear_bias(y, layer.wo, layer.wo_bias))

            h = num.round_(self._norm(x, layer.ffn_norm))
            if layer.is_moe:
                y, top = self._moe(h.view(b * t, d), layer)
                y = y.view(b, t, d)
                if routing_out is not None:
                    routing_out[moe_i] = top.view(b, t, -1)
                moe_i += 1
            else:
                y = self._swiglu(h, layer.w_gate, layer.w_up, layer.w_down)
            x = num.round_(x + y)
        h = num.round_(self._norm(x if all_positions else x[:, -1], self.norm_f))
        return num.linear(h, self.lm_head, fp8=False).float()

    def _decode(
        self,
        token: torch.Tensor,
        position: torch.Tensor,
        col: int,
        key_bias: torch.Tensor,
        routing_out: torch.Tensor | None,
    ) -> torch.Tensor:
        """One cached decode step: the same math as ``_forward`` with T == 1,
        written for the fewest ops (decode is bound by per-op overhead).

        token, position: (B,) the token fed at cache column ``col`` and its
        position id. key_bias: (B, 1, 1, col + 1) fp32 additive mask, 0 where
        the query may attend and -inf elsewhere (adding 0 or -inf gives
        exactly what ``masked_fill`` gives). routing_out: (L_moe, B, k) view
        for the natural top-k, or None. Returns fp32 logits (B, V).
        """
        num = self.num
        b = token.shape[0]
        n_heads, n_kv, head_dim = self.n_heads, self.n_kv_heads, self.head_dim
        groups = n_heads // n_kv
        x = self.tok_emb[token]  # (B, D), rows of a stored table
        cos = sin = None
        if self.pos_emb is not None:
            x = num.round_(x + self.pos_emb[position])
        else:
            angles = self._decode_angles(position)  # (B, 2, hd)
            cos = angles[:, 0].view(b, 1, 1, head_dim)
            sin = angles[:, 1].view(b, 1, 1, head_dim)
        keys, values = self._cache
        end = col + 1
        slide_bias = None
        if self.cfg.sliding_window is not None:
            # transformers' sliding window: a query at column q sees columns > q - window
            slide_bias = key_bias.clone()
            slide_bias[..., : max(0, end - self.cfg.sliding_window)] = float("-inf")
        scale = head_dim**-0.5
        moe_i = 0
        for i, layer in enumerate(self.layers):
            h = num.round_(self._norm(x, layer.attn_norm))
            if self.joint_qk:
                qkv = self._linear_bias(h, layer.wqkv, layer.qkv_bias).view(b, 3, n_heads, head_dim)
                qk = qkv[:, :2]  # (B, 2, H, hd): query and key rotated together
                if cos is not None:
                    qk = num.round_(_rotate(qk, cos, sin, head_dim))
                q, k, v = qk[:, 0], qk[:, 1], qkv[:, 2]
            else:
                q, k, v = (z[:, 0] for z in self._qkv(h[:, None], layer, b, 1))
                if cos is not None:
                    q = num.round_(_rotate(q, cos[:, 0], sin[:, 0], head_dim))
                    k = num.round_(_rotate(k, cos[:, 0], sin[:, 0], head_dim))
            keys[i, :, :, col] = k
            values[i, :, :, col] = v
            # Single-query attention by hand: for one query SDPA's blocked CPU
            # kernel costs more than these few small ops. Grouped-query: the g
            # query heads of key head j are rows of one (g, hd) @ (hd, S) product.
            q = q.reshape(b, n_kv, groups, head_dim)
            scores = (q @ keys[i, :, :, :end].transpose(-1, -2)) * scale  # (B, Hkv, g, S)
            bias = slide_bias if self.cfg.uses_sliding_window(i) else key_bias
            weights = (scores.float() + bias).softmax(-1)
            y = num.round_(weights.to(values.dtype) @ values[i, :, :, :end])  # (B, Hkv, g, hd)
            y = y.view(b, n_heads * head_dim)
            x = num.round_(x + self._linear_bias(y, layer.wo, layer.wo_bias))

            h = num.round_(self._norm(x, layer.ffn_norm))
            if layer.is_moe:
                y, top = self._moe(h, layer)
                if routing_out is not None:
                    routing_out[moe_i] = top
                moe_i += 1
            else:
                y = self._swiglu(h, layer.w_gate, layer.w_up, layer.w_down)
            x = num.round_(x + y)
        h = num.round_(self._norm(x, self.norm_f))
        return num.linear(h, self.lm_head, fp8=False).float()

    # ------------------------------------------------------------------ scoring
    def score(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0
    ) -> tuple[torch.Tensor, PackedRouting | None]:
        """Teacher-forced log-probs (B, T) and natural routing of given tokens
        (one prefill over all positions; same conventions as ``generate``)."""
        self._check_loaded()
        with torch.inference_mode():
            tokens = tokens.to(self.device)
            mask = attention_mask.to(self.device).bool()
            b, t = tokens.shape
            routing = self._routing_buffer(b, t)
            logits = self._forward(tokens, positions_from_mask(mask), mask, None, routing, True)
            logprobs = prompt_logprobs(logits, tokens, mask, temperature)
        # Clones outside inference mode: callers may use them under autograd.
        packed = None
        if routing is not None:
            packed = PackedRouting(routing.clone(), self.cfg.n_experts, mask.clone())
        return logprobs.clone(), packed

    # ------------------------------------------------------------------ sampling
    def generate(
        self,
        prompt_tokens: torch.Tensor,
        prompt_mask: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        eos_id: int | Sequence[int] | None = None,
        pad_id: int = 0,
        generator: torch.Generator | None = None,
        use_kv_cache: bool = True,
    ) -> RolloutBatch:
        """Sample up to ``max_new_tokens`` per row after left-padded prompts.

        prompt_tokens, prompt_mask: (B, P). A row stops at ``eos_id`` (EOS
        kept, later columns padded); the loop ends when every row stopped.
        ``eos_id`` is one id or several (generation_config.json's
        ``eos_token_id`` list, as transformers' ``generate`` takes it): any ends a row.
        ``temperature`` 0 decodes greedily. ``use_kv_cache=False`` recomputes
        the full prefix every step (for the benchmark).
        """
        self._check_loaded()
        p = prompt_tokens.shape[1]
        total = p + max_new_tokens
        if total > self.cfg.max_seq_len and self.pos_emb is not None:
            raise ValueError(f"prompt + max_new_tokens ({total}) exceeds max_seq_len")
        stop_ids = None
        if eos_id is not None:
            ids = [eos_id] if isinstance(eos_id, int) else list(eos_id)
            stop_ids = torch.tensor(ids, dtype=torch.long, device=self.device) if ids else None
        with torch.inference_mode():
            tokens, mask, logprobs, routing, end = self._sample(
                prompt_tokens,
                prompt_mask,
                max_new_tokens,
                temperature,
                top_p,
                stop_ids,
                pad_id,
                generator,
                use_kv_cache,
            )
        # Outputs are cloned outside inference mode: the trainer uses them
        # under autograd. A token is fed to the engine (routed) iff it is real
        # and not the last sampled column, which is never fed.
        mask = mask[:, :end].clone()
        response = torch.zeros_like(mask)
        response[:, p:] = mask[:, p:]
        packed = None
        if routing is not None:
            fed = mask.clone()
            if end > p:
                fed[:, -1] = False
            packed = PackedRouting(routing[:, :, :end].clone(), self.cfg.n_experts, fed)
        return RolloutBatch(
            tokens=tokens[:, :end].clone(),
            attention_mask=mask,
            response_mask=response,
            logprobs=logprobs[:, :end].clone(),
            routing=packed,
            prompt_len=p,
        )

    def _sample(
        self,
        prompt_tokens: torch.Tensor,
        prompt_mask: torch.Tensor,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop_ids: torch.Tensor | None,
        pad_id: int,
        generator: torch.Generator | None,
        use_kv_cache: bool,
    ):
        """The sampling loop of ``generate`` (run under inference mode); ``stop_ids``:
        (S,) the ids that end a row, None = rows never stop. Returns the
        (B, P + max_new_tokens) tokens, mask and log-prob buffers, the (L_moe, B,
        P + max_new_tokens, k) routing buffer (or None) and the number of columns used."""
        b, p = prompt_tokens.shape
        total = p + max_new_tokens
        tokens, mask = self._prompt_buffers(prompt_tokens, prompt_mask, total, pad_id)
        prompt_valid = mask[:, :p]
        routing = self._routing_buffer(b, total)
        if use_kv_cache:
            self._static_cache(b, total)
            if self.pos_emb is None:
                self._rope_table(total)

        # Prefill: every prompt position at once (prompt log-probs need all logits).
        logits = self._forward(
            tokens[:, :p],
            positions_from_mask(prompt_valid),
            prompt_valid,
            0 if use_kv_cache else None,
            None if routing is None else routing[:, :, :p],
            all_positions=True,
        )
        logprobs = torch.zeros((b, total), dtype=torch.float32, device=self.device)
        logprobs[:, :p] = prompt_logprobs(logits, tokens[:, :p], prompt_valid, temperature)
        next_logits = logits[:, -1]

        if use_kv_cache:
            n_real, key_bias = self._decode_state(prompt_valid, total)
        finished = torch.zeros(b, dtype=torch.bool, device=self.device)
        # The stop condition is read on the host every ``stop_check_every`` steps
        # only (a sync each); a loop that ran past the stop is undone below, so
        # tokens, log-probs, routing and the generator's state equal those of a
        # check after every token.
        stream = sampling_stream(generator, self.device) if temperature > 0 else None
        stream_state, stream_from, step = None, 0, -1
        for step in range(max_new_tokens):
            col = p + step
            if stream is not None and stop_ids is not None and step % self.stop_check_every == 0:
                stream_state, stream_from = stream.get_state(), step
            logp = scaled_logprobs(next_logits, temperature)
            nxt = sample_next(logp, temperature, top_p, stream)
            if stop_ids is None:  # no row ever stops: every row is alive
                alive = None
                tokens[:, col] = nxt
                mask[:, col] = True
                logprobs[:, col] = logp.gather(-1, nxt[:, None]).squeeze(-1)
            else:
                alive = ~finished
                nxt = nxt.masked_fill(finished, pad_id)
                tokens[:, col] = nxt
                mask[:, col] = alive
                logprobs[:, col] = logp.gather(-1, nxt[:, None]).squeeze(-1) * alive
                finished = finished | (alive & torch.isin(nxt, stop_ids))
            if step == max_new_tokens - 1 or (
                alive is not None
                and (step + 1) % self.stop_check_every == 0
                and all_finished(finished, self.expert_shard)
            ):
                break
            # Feed the sampled token (the next position id = real tokens before it).
            if use_kv_cache:
                next_logits = self._decode(
                    tokens[:, col],
                    n_real,
                    col,
                    key_bias[:, None, None, : col + 1],
                    None if routing is None else routing[:, :, col],
                )
                # Later queries see this column only where the token is real.
                if alive is None:
                    n_real += 1
                else:
                    n_real += alive
                    key_bias[:, col].masked_fill_(~alive, float("-inf"))
            else:
                next_logits = self._recompute_next(tokens, mask, col, routing)
        if stop_ids is None:
            return tokens, mask, logprobs, routing, total
        # Columns up to the last one where a row was alive (every row is alive at
        # step 0 and a stopped row stays stopped): one host read per call. Under
        # expert parallelism a rank that is done decodes pads for its group but
        # returns none of them.
        end = p + int(mask[:, p:].any(0).sum())
        stop = self._group_stop_step(end - p - 1)  # the step after which every row had stopped
        if step > stop:  # sampled past the stop: undo what a per-step check never did
            if routing is not None:
                routing[:, :, p + stop :] = 0  # columns fed only after the stop
            if stream is not None:
                replay_draws(stream, stream_state, stop + 1 - stream_from, next_logits)
        return tokens, mask, logprobs, routing, end

    def _group_stop_step(self, local_stop: int) -> int:
        """The decode step at which every row had stopped: here, and under expert
        parallelism on every rank of the group (which decodes in lockstep until
        its last rank is done); ``local_stop`` is this rank's."""
        if self.expert_shard is None:
            return local_stop
        stop = torch.tensor([local_stop], device=self.device)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX, group=self.expert_shard.group)
        return int(stop.item())

    def _decode_state(
        self, prompt_valid: torch.Tensor, total: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """KV-cache decode state, updated in place by the loop: (B,) next position ids
        (real tokens so far) and the (B, total) additive attention mask over cache columns."""
        b, p = prompt_valid.shape
        n_real = prompt_valid.sum(-1)
        key_bias = torch.zeros((b, total), dtype=torch.float32, device=self.device)
        key_bias[:, :p].masked_fill_(~prompt_valid, float("-inf"))
        return n_real, key_bias

    def _prompt_buffers(
        self, prompt_tokens: torch.Tensor, prompt_mask: torch.Tensor, total: int, pad_id: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, total) token and mask buffers with the (B, P) prompt in the first columns."""
        prompt = prompt_tokens.to(self.device)
        b, p = prompt.shape
        tokens = torch.full((b, total), pad_id, dtype=torch.long, device=self.device)
        tokens[:, :p] = prompt
        mask = torch.zeros((b, total), dtype=torch.bool, device=self.device)
        mask[:, :p] = prompt_mask.to(self.device).bool()
        return tokens, mask

    def _recompute_next(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor,
        col: int,
        routing: torch.Tensor | None,
    ) -> torch.Tensor:
        """Without a KV cache: a full forward over columns 0..col, the (B, V) logits of
        the last one; column ``col``'s routing is copied into ``routing`` (L, B, T, k)."""
        step_routing = None if routing is None else self._routing_buffer(tokens.shape[0], col + 1)
        next_logits = self._forward(
            tokens[:, : col + 1],
            positions_from_mask(mask[:, : col + 1]),
            mask[:, : col + 1],
            None,
            step_routing,
        )
        if routing is not None:
            routing[:, :, col] = step_routing[:, :, col]
        return next_logits

    # ------------------------------------------------------------------ helpers
    def _check_loaded(self) -> None:
        if not self.loaded:
            raise RuntimeError("call load_weights(model.state_dict()) before generating")

    def _routing_buffer(self, batch: int, length: int) -> torch.Tensor | None:
        n_moe = self.n_moe_layers
        if not n_moe:
            return None
        return torch.zeros(
            (n_moe, batch, length, self.cfg.top_k),
            dtype=index_dtype(self.cfg.n_experts),
            device=self.device,
        )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int):
    """Rotary on (..., hd) with the sign-folded sin table (``_rope_table``), in fp32."""
    xf = x.float()
    return (xf * cos + xf.roll(head_dim // 2, dims=-1) * sin).to(x.dtype)


def _attention(q, k, v, mask4d):
    """Softmax attention. One query per row (decode) is done by hand: for a
    single query SDPA's blocked CPU kernel costs more than three small ops."""
    if q.shape[2] > 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask4d)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    weights = scores.float().masked_fill(~mask4d, float("-inf")).softmax(-1)
    return weights.to(v.dtype) @ v


def prompt_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """logprob[b, t] = log p(tokens[b, t] | tokens[b, :t]) from logits at t - 1.

    logits: (B, T, V); tokens, mask: (B, T). 0 where t or t - 1 is not a real
    token (the first real token, pads). fp32.
    """
    logp = scaled_logprobs(logits[:, :-1], temperature)
    picked = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    valid = mask[:, 1:] & mask[:, :-1]
    out = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    out[:, 1:] = picked * valid
    return out
