"""Bring-your-own Hugging Face checkpoints: config mapping, weight names,
streaming import and export (docs/models.md).

Never imports transformers: checkpoints are read with ``safetensors`` and the
checkpoint's own config.json.
"""

from trainer.hf.export import export_hf, export_run
from trainer.hf.families import FAMILIES, hf_config_from_model, model_fields_from_hf
from trainer.hf.loader import build_model, load_hf_weights, resolve_model_source

__all__ = [
    "FAMILIES",
    "build_model",
    "export_hf",
    "export_run",
    "hf_config_from_model",
    "load_hf_weights",
    "model_fields_from_hf",
    "resolve_model_source",
]
