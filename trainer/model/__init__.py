"""Training model: decoder-only transformer with dense or MoE FFNs.

See docs/trainer-internals.md ("Model") for the interface.

The names below load on first use (PEP 562), so the package's torch-free
modules (``trainer.model.param_count``) import without torch: the web process
checks a config's parameter count and never loads torch (docs/design.md,
"The platform's contract with the trainer").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.model.dispatch import experts_swiglu
    from trainer.model.layers import KVCache, positions_from_mask
    from trainer.model.moe import LayerRouting, MoELayer, Router, topk_gates
    from trainer.model.transformer import ModelOutput, TransformerLM

_HOME = {
    "experts_swiglu": "trainer.model.dispatch",
    "KVCache": "trainer.model.layers",
    "positions_from_mask": "trainer.model.layers",
    "LayerRouting": "trainer.model.moe",
    "MoELayer": "trainer.model.moe",
    "Router": "trainer.model.moe",
    "topk_gates": "trainer.model.moe",
    "ModelOutput": "trainer.model.transformer",
    "TransformerLM": "trainer.model.transformer",
}

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


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'trainer.model' has no attribute '{name}'")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value
