"""The one table of floating-point dtypes the trainer names, by both spellings.

Configs say ``fp32`` / ``bf16`` / ``fp16`` (``rollout.precision``,
``optim.param_dtype``); Hugging Face files and the export's ``--dtype`` say
``float32`` / ``bfloat16`` / ``float16`` (config.json's ``torch_dtype``).
"""

from __future__ import annotations

import torch

# config name -> torch dtype
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
# config name -> Hugging Face name
HF_NAMES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Hugging Face name -> torch dtype
HF_DTYPES: dict[str, torch.dtype] = {HF_NAMES[name]: dtype for name, dtype in DTYPES.items()}
