"""Routing replay (R3, arXiv 2510.11370; R2 from GSPO, arXiv 2507.18071): the pieces that
do not need the model.

* ``replay_keep_mask``: which (token, MoE layer) pairs replay the recorded routing during
  the warm-up, and ``replayed_fraction`` for the metric ``r3/replayed_frac``.
* ``pack_routing`` / ``unpack_routing``: the recorded top-k indices in the smallest form
  that holds them (k indices of ceil(log2 E) bits, bit-packed), optionally run-length
  encoded or zlib-compressed, measured against the log2 C(E, k) bound.
* ``RouterAnchor``: the router-anchoring KL regulariser over a bounded buffer of the
  routing distributions of recent steps.
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

Compression = Literal["none", "rle", "zlib"]

# Longest run one run-length byte can count; longer runs are split.
_MAX_RUN = 255


# --------------------------------------------------------------------------- warm-up schedule
def own_choice_share(step: int, warmup_steps: int, keep_frac: float) -> float:
    """Share p(step) of (token, layer) pairs that keep the training router's own choice.

    ``p = keep_frac * (1 - step / warmup_steps)`` for ``0 <= step < warmup_steps``,
    a linear shrink from ``keep_frac`` at step 0 to 0 at ``warmup_steps``; 0 after
    the warm-up and when ``warmup_steps`` is 0 (replay from the first step).
    """
    if warmup_steps <= 0 or step >= warmup_steps:
        return 0.0
    return keep_frac * (1.0 - max(step, 0) / warmup_steps)


def replay_keep_mask(
    shape: tuple[int, int],
    n_layers: int,
    step: int,
    warmup_steps: int,
    keep_frac: float,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> list[Tensor]:
    """Per MoE layer a ``BoolTensor shape=(B, T)``: True = REPLAY the recorded routing.

    False = the pair keeps the training router's own (natural) top-k. Each pair
    independently keeps its own choice with probability ``own_choice_share(step, ...)``,
    so the share follows the schedule in expectation; the draw comes from
    ``generator`` only (deterministic given its seed). When that share is 0 no
    random numbers are drawn and every mask is all True. The list is what the
    model's ``override_mask`` takes.
    """
    p = own_choice_share(step, warmup_steps, keep_frac)
    if device is None and generator is not None:
        device = generator.device
    if p <= 0.0:
        return list(torch.ones(n_layers, *shape, dtype=torch.bool, device=device).unbind(0))
    u = torch.rand(n_layers, *shape, generator=generator, device=device)
    return list((u >= p).unbind(0))


def replayed_fraction(masks: list[Tensor], token_mask: Tensor | None = None) -> float:
    """``r3/replayed_frac``: share of (token, layer) pairs that replay, over ``token_mask``.

    ``masks``: per layer ``(B, T)`` bool from ``replay_keep_mask``; ``token_mask (B, T)``:
    the tokens that count (None = all). 0 when nothing counts.
    """
    if not masks:
        return 0.0
    stacked = torch.stack(masks).float()  # (L, B, T)
    if token_mask is None:
        return float(stacked.mean())
    w = token_mask.float().expand_as(stacked)
    return float((stacked * w).sum() / w.sum().clamp_min(1.0))


# --------------------------------------------------------------------------- compact storage
def index_bits(n_experts: int) -> int:
    """Bits of one expert index: ceil(log2 E), at least 1."""
    if n_experts < 1:
        raise ValueError(f"n_experts must be >= 1, got {n_experts}")
    return max(1, (n_experts - 1).bit_length())


def combination_bound_bits(n_experts: int, k: int) -> float:
    """Information bound for one top-k SET of E experts: log2 C(E, k) bits.

    The packing below stores the k indices in order (k * ceil(log2 E) bits), which
    is above this bound; the routing decision itself is the unordered set.
    """
    return math.log2(math.comb(n_experts, k))


def _bit_shifts(width: int, device: torch.device) -> Tensor:
    return torch.arange(width - 1, -1, -1, device=device, dtype=torch.int64)


def _pack_bits(values: Tensor, width: int) -> Tensor:
    """Big-endian bit stream of ``values (M,)`` at ``width`` bits each -> uint8 bytes.

    The first value's highest bit is the highest bit of the first byte; the last
    byte is padded with zero bits.
    """
    v = values.reshape(-1).to(torch.int64)
    bits = ((v[:, None] >> _bit_shifts(width, v.device)) & 1).to(torch.uint8).reshape(-1)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    byte_shifts = _bit_shifts(8, v.device)
    return (bits.view(-1, 8).to(torch.int64) << byte_shifts).sum(dim=1).to(torch.uint8)


def _unpack_bits(data: Tensor, width: int, count: int) -> Tensor:
    """Inverse of ``_pack_bits``: the first ``count`` values, int64 ``(count,)``."""
    bits = (data.to(torch.int64)[:, None] >> _bit_shifts(8, data.device)) & 1
    bits = bits.reshape(-1)[: count * width].view(count, width)
    return (bits << _bit_shifts(width, data.device)).sum(dim=1)


def _run_lengths(rows: Tensor) -> tuple[Tensor, Tensor]:
    """Runs of identical consecutive rows of ``rows (M, k)``: ``(values (R, k), counts (R,))``.

    Runs longer than 255 are split so every count fits one byte.
    """
    m = rows.shape[0]
    new_run = torch.ones(m, dtype=torch.bool, device=rows.device)
    new_run[1:] = (rows[1:] != rows[:-1]).any(dim=-1)
    starts = new_run.nonzero().squeeze(1)
    counts = torch.diff(starts, append=torch.tensor([m], device=rows.device))
    n_chunks = (counts + _MAX_RUN - 1) // _MAX_RUN
    values = rows[starts].repeat_interleave(n_chunks, dim=0)
    chunk_counts = torch.full((int(n_chunks.sum()),), _MAX_RUN, device=rows.device)
    chunk_counts[n_chunks.cumsum(0) - 1] = counts - _MAX_RUN * (n_chunks - 1)
    return values, chunk_counts


@dataclass(frozen=True)
class PackedReplay:
    """Recorded routing of one batch, every MoE layer, in compact form.

    ``data``: 1-D uint8 payload. ``compression``:

    * ``"none"``: the indices in (layer, batch, position, slot) order, each in
      ``bits`` = ceil(log2 E) bits, one big-endian bit stream (16 experts, top-2:
      one byte per token per layer).
    * ``"rle"``: runs of consecutive token-layers with identical routing: the run
      values bit-packed as above (``n_runs`` of them, k indices each), then one
      byte per run with its length (1-255).
    * ``"zlib"``: the ``"none"`` payload through zlib (level 9).
    """

    data: Tensor
    n_layers: int
    batch_shape: tuple[int, int]
    k: int
    n_experts: int
    bits: int
    compression: Compression
    n_runs: int = 0

    @property
    def n_token_layers(self) -> int:
        return self.n_layers * self.batch_shape[0] * self.batch_shape[1]

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())

    @property
    def bytes_per_token_layer(self) -> float:
        """Payload bytes per (token, MoE layer): the metric ``r3/bytes_per_token_layer``."""
        return self.nbytes / max(self.n_token_layers, 1)


def pack_routing(
    indices: list[Tensor], n_experts: int, compression: Compression = "none"
) -> PackedReplay:
    """Pack one ``LongTensor (B, T, k)`` of expert ids per MoE layer into a ``PackedReplay``."""
    if not indices:
        raise ValueError("no MoE layers to pack")
    shape = tuple(indices[0].shape)
    if len(shape) != 3 or any(tuple(t.shape) != shape for t in indices):
        raise ValueError(f"every layer's indices must share one (B, T, k) shape, got {shape}")
    b, t, k = shape
    stacked = torch.stack(indices).to(torch.int64)  # (L, B, T, k)
    if stacked.numel() and (int(stacked.min()) < 0 or int(stacked.max()) >= n_experts):
        raise ValueError(f"expert ids must lie in [0, {n_experts})")
    bits = index_bits(n_experts)
    n_runs = 0
    if compression == "rle":
        values, counts = _run_lengths(stacked.view(-1, k))
        n_runs = values.shape[0]
        data = torch.cat([_pack_bits(values, bits), counts.to(torch.uint8)])
    elif compression in ("none", "zlib"):
        data = _pack_bits(stacked, bits)
        if compression == "zlib":
            raw = zlib.compress(data.cpu().numpy().tobytes(), 9)
            data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    else:
        raise ValueError(f"compression must be none, rle or zlib, not {compression!r}")
    return PackedReplay(data, len(indices), (b, t), k, n_experts, bits, compression, n_runs)


def unpack_routing(packed: PackedReplay, device: torch.device | str | None = None) -> list[Tensor]:
    """Inverse of ``pack_routing``: one ``LongTensor (B, T, k)`` per MoE layer."""
    data = packed.data
    k, bits = packed.k, packed.bits
    if packed.compression == "zlib":
        data = torch.frombuffer(
            bytearray(zlib.decompress(data.cpu().numpy().tobytes())), dtype=torch.uint8
        )
    data = data.to(device) if device is not None else data
    if packed.compression == "rle":
        value_bytes = (packed.n_runs * k * bits + 7) // 8
        values = _unpack_bits(data[:value_bytes], bits, packed.n_runs * k).view(-1, k)
        counts = data[value_bytes : value_bytes + packed.n_runs].to(torch.int64)
        flat = values.repeat_interleave(counts, dim=0)
    else:
        flat = _unpack_bits(data, bits, packed.n_token_layers * k)
    b, t = packed.batch_shape
    return list(flat.view(packed.n_layers, b, t, k).unbind(0))


def storage_report(packed: PackedReplay) -> dict[str, float]:
    """Measured storage against the information bound, in bits per (token, layer).

    ``bits_per_token_layer``: the payload as stored; ``fixed_width_bits``: k * ceil(log2 E);
    ``bound_bits``: log2 C(E, k); ``ratio_to_bound``: measured / bound (inf when the
    bound is 0, i.e. k = E or k = 0, where nothing needs storing).
    """
    measured = 8.0 * packed.bytes_per_token_layer
    bound = combination_bound_bits(packed.n_experts, packed.k)
    return {
        "bits_per_token_layer": measured,
        "fixed_width_bits": float(packed.k * packed.bits),
        "bound_bits": bound,
        "ratio_to_bound": measured / bound if bound > 0 else math.inf,
    }


# --------------------------------------------------------------------------- router anchoring
class RouterAnchor:
    """Router-anchoring KL regulariser over the routing of recent steps.

    What is stored (bounded memory, ``buffer_steps * L * E`` floats): for each of the
    last ``buffer_steps`` steps, the step's MARGINAL router distribution per MoE layer,
    q_s = mean over that step's tokens of the router softmax (several ``add`` calls in
    one step, e.g. one per minibatch, are merged token-weighted). The anchor is the
    mean of the stored q_s. Marginals need no fixed probe tokens, so any batch can be
    compared with any recorded step; anchoring each token's distribution to a marginal
    would instead pull every token towards the same routing and erase specialisation.

    ``loss(current)`` = mean over layers of KL(anchor || p), p = the current batch's
    marginal (carries the gradient). Direction: the recorded distribution is the
    reference and the current router the model, the forward (mass-covering) KL:
    it grows without bound as the current router stops sending probability to an
    expert the recent steps used (p_e -> 0 with q_e > 0), which is the collapse it is
    meant to resist; the reverse KL(p || anchor) lets p drop experts cheaply
    (mode-seeking). In ``torch.nn.functional.kl_div`` terms this is
    ``kl_div(p.log(), anchor, reduction="sum")``: the first argument must be the
    current LOG-probabilities and the second the reference probabilities (passing raw
    logits for both, as a widely copied snippet does, computes neither KL).

    The coefficient (config ``router_kl_coef``, e.g. 0.1) is applied by the caller.
    Call ``loss`` before ``add`` in a step, so a step is not anchored to itself.
    """

    def __init__(self, buffer_steps: int, eps: float = 1e-8) -> None:
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
        self.buffer_steps = buffer_steps
        self.eps = eps
        # one entry per step: [step, sum of token distributions (L, E), token count]
        self._entries: deque[list[Any]] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _token_sum(probs: Tensor, mask: Tensor | None) -> tuple[Tensor, float]:
        """``probs (N, E)`` or ``(L, N, E)`` -> (sum over masked tokens ``(L, E)``, count)."""
        p = probs.detach().float()
        if p.dim() == 2:
            p = p.unsqueeze(0)
        if mask is None:
            return p.sum(dim=1), float(p.shape[1])
        w = mask.to(torch.float32).reshape(1, -1, 1)
        return (p * w).sum(dim=1), float(w.sum())

    def _current_marginal(self, probs: Tensor, mask: Tensor | None) -> Tensor:
        p = probs.float()
        if p.dim() == 2:
            p = p.unsqueeze(0)
        if mask is None:
            return p.mean(dim=1)
        w = mask.to(torch.float32).reshape(1, -1, 1)
        return (p * w).sum(dim=1) / w.sum().clamp_min(1.0)

    def add(self, step: int, probs: Tensor, mask: Tensor | None = None) -> None:
        """Record the router softmax of step ``step`` (detached).

        ``probs (N, E)`` for one MoE layer or ``(L, N, E)`` for all; ``mask (N,)``
        the tokens that count (None = all). Steps must not decrease; steps older
        than the last ``buffer_steps`` are dropped.
        """
        total, count = self._token_sum(probs, mask)
        if count <= 0:
            return
        if self._entries and step < self._entries[-1][0]:
            raise ValueError(f"step {step} is older than the last recorded step")
        if self._entries and self._entries[-1][0] == step:
            self._entries[-1][1] = self._entries[-1][1].to(total.device) + total
            self._entries[-1][2] += count
        else:
            self._entries.append([step, total, count])
        while len(self._entries) > self.buffer_steps:
            self._entries.popleft()

    def anchor(self) -> Tensor | None:
        """The mean of the recorded per-step marginals, ``(L, E)``; None when empty."""
        if not self._entries:
            return None
        device = self._entries[-1][1].device  # entries restored from a checkpoint are on CPU
        per_step = torch.stack([total.to(device) / count for _, total, count in self._entries])
        return per_step.mean(dim=0)

    def loss(self, current_probs: Tensor, mask: Tensor | None = None) -> Tensor:
        """KL(anchor || current marginal), mean over layers; 0 with an empty buffer.

        ``current_probs (N, E)`` or ``(L, N, E)``, the same layer layout as ``add``.
        """
        q = self.anchor()
        if q is None:
            return current_probs.new_zeros((), dtype=torch.float32)
        p = self._current_marginal(current_probs, mask)
        if p.shape != q.shape:
            raise ValueError(
                f"router distribution shape {tuple(p.shape)} != recorded {tuple(q.shape)}"
            )
        q = q.to(p.device)
        kl = (torch.special.xlogy(q, q) - q * torch.log(p.clamp_min(self.eps))).sum(dim=-1)
        return kl.mean()

    def state_dict(self) -> dict[str, Any]:
        return {
            "buffer_steps": self.buffer_steps,
            "steps": [int(s) for s, _, _ in self._entries],
            "sums": [total.cpu() for _, total, _ in self._entries],
            "counts": [float(c) for _, _, c in self._entries],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer_steps = int(state["buffer_steps"])
        self._entries = deque(
            [s, total.float(), c]
            for s, total, c in zip(state["steps"], state["sums"], state["counts"], strict=True)
        )
