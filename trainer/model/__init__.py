"""Training model: decoder-only transformer with dense or MoE FFNs.

See docs/trainer-internals.md ("Model") for the interface.
"""

from trainer.model.dispatch import experts_swiglu
from trainer.model.layers import KVCache, positions_from_mask
from trainer.model.moe import LayerRouting, MoELayer, Router, topk_gates
from trainer.model.transformer import ModelOutput, TransformerLM

__all__ = [
    "KVCache",
    "LayerRouting",
    "MoELayer",
    "ModelOutput",
    "Router",
    "TransformerLM",
    "experts_swiglu",
    "positions_from_mask",
    "topk_gates",
]
