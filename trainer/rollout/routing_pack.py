"""Compact storage of per-token MoE routing (the rollout's natural top-k).

Routing replay (R3, arXiv 2510.11370) ships each token's top-k expert ids
from the inference engine to the trainer. Stored per (layer, token) as k
integers of the smallest integer dtype that holds E (uint8 for E <= 256:
k bytes per token per layer). For the trip to the trainer the loop bit-packs
them at ceil(log2 E) bits per index (``trainer.stabilizers.replay.pack_routing``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
