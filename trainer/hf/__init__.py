"""Bring-your-own Hugging Face checkpoints: config mapping, weight names,
streaming import and export (docs/models.md; a run's checkpoint is exported by
``trainer.run.export``).

Never imports transformers: checkpoints are read with ``safetensors`` and the
checkpoint's own config.json.

The names below load on first use (PEP 562), so the torch-free modules
(``trainer.hf.families``, ``trainer.hf.loader``'s config reader) import without
torch in the web process (docs/design.md, "The platform's contract with the
trainer").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.hf.export import export_hf
    from trainer.hf.export_config import hf_config_from_model
    from trainer.hf.families import FAMILIES, model_fields_from_hf
    from trainer.hf.loader import build_model, load_hf_weights, resolve_model_source

_HOME = {
    "export_hf": "trainer.hf.export",
    "FAMILIES": "trainer.hf.families",
    "hf_config_from_model": "trainer.hf.export_config",
    "model_fields_from_hf": "trainer.hf.families",
    "build_model": "trainer.hf.loader",
    "load_hf_weights": "trainer.hf.loader",
    "resolve_model_source": "trainer.hf.loader",
}

__all__ = [
    "FAMILIES",
    "build_model",
    "export_hf",
    "hf_config_from_model",
    "load_hf_weights",
    "model_fields_from_hf",
    "resolve_model_source",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'trainer.hf' has no attribute '{name}'")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value
