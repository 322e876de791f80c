"""Compact storage of per-token MoE routing (the rollout's natural top-k).

Routing replay (R3, arXiv 2510.11370) ships each token's top-k expert ids
from the inference engine to the trainer. Stored per (layer, token) as k
integers of the smallest integer dtype that holds E (uint8 for E <= 256:
k bytes per token per layer), or bit-packed at ceil(log2 E) bits per index
(k * ceil(log2 E) / 8 bytes, e.g. 0.75 B for top-2 of 8 experts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def index_dtype(n_experts: int) -> torch.dtype:
    """Smallest integer dtype that holds expert ids 0..E-1."""
    if n_experts <= 256:
        return torch.uint8
    if n_experts <= 2**15:
        return torch.int16
    return torch.int32


def bits_per_index(n_experts: int) -> int:
    return max(1, math.ceil(math.log2(n_experts)))


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

    def bitpack(self) -> BitPackedRouting:
        return BitPackedRouting.pack(self)


@dataclass
class BitPackedRouting:
    """Indices packed at ``bits`` bits each, little-endian within a byte stream."""

    data: torch.Tensor  # (n_bytes,) uint8
    shape: tuple[int, int, int, int]  # (L, B, T, k)
    n_experts: int
    bits: int
    routing_mask: torch.Tensor

    @classmethod
    def pack(cls, routing: PackedRouting) -> BitPackedRouting:
        bits = bits_per_index(routing.n_experts)
        values = routing.indices.reshape(-1).long()
        shifts = torch.arange(bits, device=values.device)
        stream = ((values[:, None] >> shifts) & 1).reshape(-1)  # LSB first
        stream = torch.nn.functional.pad(stream, (0, (-stream.numel()) % 8))
        weights = 1 << torch.arange(8, device=values.device)
        data = (stream.view(-1, 8) * weights).sum(-1).to(torch.uint8)
        shape = tuple(routing.indices.shape)
        return cls(data, shape, routing.n_experts, bits, routing.routing_mask)  # type: ignore[arg-type]

    @property
    def bytes_per_token_layer(self) -> float:
        return self.shape[-1] * self.bits / 8

    def to_packed(self) -> PackedRouting:
        n_values = math.prod(self.shape)
        bit_stream = (self.data.long()[:, None] >> torch.arange(8, device=self.data.device)) & 1
        bit_stream = bit_stream.reshape(-1)[: n_values * self.bits].view(n_values, self.bits)
        values = (bit_stream << torch.arange(self.bits, device=self.data.device)).sum(-1)
        return PackedRouting(
            values.view(self.shape).to(index_dtype(self.n_experts)),
            self.n_experts,
            self.routing_mask,
        )

    def unpack(self) -> list[torch.Tensor]:
        return self.to_packed().unpack()
