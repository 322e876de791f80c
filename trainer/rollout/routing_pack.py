"""Compact storage of per-token MoE routing (the rollout's natural top-k).

Routing replay (R3, arXiv 2510.11370) ships each token's top-k expert ids
from the inference engine to the trainer. Stored per (layer, token) as k
integers of the smallest integer dtype that holds E (uint8 for E <= 256:
k bytes per token per layer). For the trip to the trainer ``pack_routing``
bit-packs them at ceil(log2 E) bits per index, optionally run-length encoded or
zlib-compressed, measured against the log2 C(E, k) bound (``storage_report``).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Compression = Literal["none", "rle", "zlib"]

# Longest run one run-length byte can count; longer runs are split.
_MAX_RUN = 255


def index_dtype(n_experts: int) -> torch.dtype:
    """Smallest integer dtype that holds expert ids 0..E-1."""
    if n_experts <= 256:
        return torch.uint8
    if n_experts <= 2**15:
        return torch.int16
    return torch.int32


@dataclass
class PackedRouting:
    """Natural top-k expert ids of every MoE layer for every token fed to the engine.

    indices: (L, B, T, k) in ``index_dtype(n_experts)``
    routing_mask: (B, T) bool, True where the token was fed to the engine and is
        real (False on pads and on the last sampled token, never fed)
    """

    indices: torch.Tensor
    n_experts: int
    routing_mask: torch.Tensor

    @classmethod
    def from_indices(
        cls, indices: list[torch.Tensor] | torch.Tensor, n_experts: int, routing_mask: torch.Tensor
    ) -> PackedRouting:
        """indices: list of L LongTensors (B, T, k), or a stacked (L, B, T, k) tensor."""
        stacked = torch.stack(list(indices)) if isinstance(indices, list) else indices
        return cls(stacked.to(index_dtype(n_experts)), n_experts, routing_mask.bool())

    @property
    def n_layers(self) -> int:
        return self.indices.shape[0]

    @property
    def top_k(self) -> int:
        return self.indices.shape[-1]

    @property
    def bytes_per_token_layer(self) -> float:
        return float(self.top_k * self.indices.element_size())

    def unpack(self) -> list[torch.Tensor]:
        """L LongTensors (B, T, k): the ``routing_override`` format of the model."""
        return [layer.long() for layer in self.indices]

    def to(self, device: torch.device | str) -> PackedRouting:
        return PackedRouting(self.indices.to(device), self.n_experts, self.routing_mask.to(device))


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
