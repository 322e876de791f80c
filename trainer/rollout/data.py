"""One rollout batch as the trainer sees it (``RolloutData``), and the engine's
routing on its way to the trainer (``ship_routing``).

Data flow (docs/design.md, "data flow"): the rollout engine returns a
``RolloutBatch``; ``RolloutData.from_rollout`` moves it to the trainer with the
routing bit-packed and unpacked as a replay batch would travel; ``measure_batch``
and the stabilizers then fill in the training-side fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from trainer.rollout.routing_pack import Compression, pack_routing, unpack_routing

if TYPE_CHECKING:
    from trainer.rollout.engine import RolloutBatch
    from trainer.rollout.routing_pack import PackedRouting


@dataclass
class ShippedRouting:
    """The engine's routing after the trip to the trainer.

    indices: per MoE layer ``(B, T, k)`` int64; mask: ``(B, T)`` True where the
    engine recorded routing; bytes_per_token_layer: the packed payload's size, the
    metric ``r3/bytes_per_token_layer``.
    """

    indices: list[Tensor]
    mask: Tensor
    bytes_per_token_layer: float


def ship_routing(routing: PackedRouting, compression: Compression = "none") -> ShippedRouting:
    """Pack the engine's natural top-k (ceil(log2 E) bits per index, then optional
    RLE/zlib) and unpack it on the trainer's side, as a replay batch would travel."""
    packed = pack_routing(list(routing.indices.unbind(0)), routing.n_experts, compression)
    indices = unpack_routing(packed, device=routing.indices.device)
    return ShippedRouting(indices, routing.routing_mask, packed.bytes_per_token_layer)


@dataclass
class RolloutData:
    """One rollout batch on the training device; tensors are (B, T) unless noted."""

    tokens: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    rollout_logp: torch.Tensor
    rewards: torch.Tensor  # (B,)
    rollout_routing: list[torch.Tensor] | None  # per MoE layer (B, T, k), rollout engine
    routing_mask: torch.Tensor | None  # True where the engine recorded routing
    routing_bytes_per_token_layer: float | None = None
    # R3: per MoE layer (B, T), True = replay the engine's routing (Stabilizers.begin_step)
    replay_mask: list[torch.Tensor] | None = None
    # Filled by measure_batch:
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    old_routing: list[torch.Tensor] | None = None  # training forward's natural top-k
    # Over several ranks this batch is rows [global_offset, global_offset + B) of a
    # global batch of global_size rows (trainer.distributed); None = the whole batch.
    global_offset: int = 0
    global_size: int | None = None

    @classmethod
    def from_rollout(
        cls, rollout: RolloutBatch, rewards: torch.Tensor, compression: str = "none"
    ) -> RolloutData:
        """The engine's routing arrives bit-packed with ``compression`` and is unpacked."""
        routing = rollout.routing
        shipped = ship_routing(routing, compression) if routing is not None else None
        return cls(
            tokens=rollout.tokens,
            attention_mask=rollout.attention_mask,
            response_mask=rollout.response_mask,
            rollout_logp=rollout.logprobs,
            rewards=rewards,
            rollout_routing=shipped.indices if shipped is not None else None,
            routing_mask=shipped.mask if shipped is not None else None,
            routing_bytes_per_token_layer=(
                shipped.bytes_per_token_layer if shipped is not None else None
            ),
        )

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def global_batch_size(self) -> int:
        return self.global_size if self.global_size is not None else self.batch_size
