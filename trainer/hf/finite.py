"""Whether a checkpoint's weights are finite, read from the files without torch.

    bad = nonfinite_tensors(folder)      # ["model.norm.weight", ...]: tensors holding NaN or Inf
    weight_bytes(folder)                 # how much that reads

An IEEE float is NaN or infinite exactly when its exponent bits are all ones
(IEEE 754-2008, section 3.4), so each tensor's data is read in chunks straight
from its byte range (``trainer.hf.validate.read_safetensors_header``), viewed as
unsigned integers of its width, and masked: F16 0x7C00, BF16 0x7F80, F32
0x7F800000, F64 0x7FF0000000000000. Memory stays at one chunk; time is the
disk's (about 1 GB/s here). The registry scans at registration (a large
checkpoint on the control queue's worker, ``lab.assets``); the trainer checks
the tensors it loads as it loads them (``trainer.hf.loader``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainer.hf.validate import TensorEntry, checkpoint_headers

CHUNK_BYTES = 16 * 1024 * 1024
EXPONENT_MASKS: dict[str, tuple[type, int]] = {
    "F16": (np.uint16, 0x7C00),
    "BF16": (np.uint16, 0x7F80),
    "F32": (np.uint32, 0x7F80_0000),
    "F64": (np.uint64, 0x7FF0_0000_0000_0000),
}


def weight_bytes(folder: Path) -> int:
    """Bytes of tensor data in the checkpoint (what a scan reads)."""
    return sum(entry.end - entry.begin for entry in checkpoint_headers(folder).values())


def tensor_is_finite(entry: TensorEntry) -> bool:
    """True when no element of the tensor is NaN or infinite (non-float dtypes: True)."""
    if entry.dtype not in EXPONENT_MASKS:
        return True
    kind, mask = EXPONENT_MASKS[entry.dtype]
    width = np.dtype(kind).itemsize
    step = CHUNK_BYTES - CHUNK_BYTES % width
    with entry.file.open("rb") as f:
        f.seek(entry.begin)
        left = entry.end - entry.begin
        while left > 0:
            raw = f.read(min(step, left))
            if not raw:
                return True  # a truncated file is the header check's error
            left -= len(raw)
            bits = np.frombuffer(raw[: len(raw) - len(raw) % width], dtype=kind)
            if np.any((bits & kind(mask)) == kind(mask)):
                return False
    return True


def nonfinite_tensors(folder: Path, most: int = 5) -> list[str]:
    """The first ``most`` tensors (in name order) holding NaN or Inf; [] when all are
    finite. FieldError from the headers as ``validate_checkpoint`` reports them."""
    bad = []
    for name, entry in sorted(checkpoint_headers(folder).items()):
        if not tensor_is_finite(entry):
            bad.append(name)
            if len(bad) >= most:
                break
    return bad
