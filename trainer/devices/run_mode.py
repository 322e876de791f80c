"""How a run uses its device: the numerics mode (``run.deterministic``, ``run.tf32``),
true phase timings. What summary.json records about the device, with the
backends the run chose on it, is ``trainer.run.device_record`` (above the model
and the engine whose choices it reports).

* Deterministic mode: ``torch.use_deterministic_algorithms(True)`` (an op
  without a deterministic kernel raises instead of silently varying),
  ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS's documented requirement for
  reproducible GEMMs from CUDA 10.2 on: a fixed workspace per stream), cuDNN
  benchmark off and cuDNN deterministic. PyTorch's reproducibility notes:
  same seed, same hardware and software give the same bits.
* TF32 (a 10-bit-mantissa fp32 GEMM on Ampere and later) is switched off
  unless ``run.tf32`` asks for it, and the run checks that it is off before it
  starts: an fp32 control run that silently ran TF32 GEMMs would gain a
  training-inference gap of its own.
* ``phase_clock`` waits for the device before reading the clock on CUDA, so
  ``time/*`` metrics measure the device's work of a phase, not its launch
  (kernel launches return before the kernel ran).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch

from trainer.config import ExperimentConfig

CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
# The two settings cuBLAS documents as reproducible.
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


class NumericsModeError(RuntimeError):
    """The process cannot run in the requested numerics mode (names the setting)."""


def phase_clock(device: torch.device) -> float:
    """``time.perf_counter()`` after every queued kernel on ``device`` finished
    (a synchronise on CUDA; the CPU runs ops eagerly)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _tf32_state() -> tuple[bool, bool, str]:
    return (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )


def check_tf32_off() -> None:
    """Raise unless fp32 matmuls run in full fp32 (no TF32, no bf16 passes)."""
    matmul, cudnn, precision = _tf32_state()
    if matmul or cudnn or precision != "highest":
        raise NumericsModeError(
            f"run.tf32 is false but TF32 is on (cuda.matmul.allow_tf32={matmul}, "
            f"cudnn.allow_tf32={cudnn}, float32_matmul_precision={precision!r}): "
            "something in this process switched it on; set run.tf32=true to allow it"
        )


@contextmanager
def numerics_mode(cfg: ExperimentConfig, device: torch.device):
    """Apply ``run.deterministic`` and ``run.tf32`` for the block, then restore the
    process's previous settings (a test or a study runs many runs in one process)."""
    run = cfg.run
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        _tf32_state(),
        os.environ.get(CUBLAS_WORKSPACE_ENV),
    )
    try:
        torch.backends.cuda.matmul.allow_tf32 = run.tf32
        torch.backends.cudnn.allow_tf32 = run.tf32
        if not run.tf32:
            torch.set_float32_matmul_precision("highest")
            check_tf32_off()
        if run.deterministic:
            workspace = os.environ.get(CUBLAS_WORKSPACE_ENV)
            if workspace is None:
                os.environ[CUBLAS_WORKSPACE_ENV] = CUBLAS_DETERMINISTIC[0]
            elif workspace not in CUBLAS_DETERMINISTIC:
                raise NumericsModeError(
                    f"run.deterministic needs {CUBLAS_WORKSPACE_ENV} in "
                    f"{CUBLAS_DETERMINISTIC}, and the environment sets {workspace!r}"
                )
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.deterministic = True
        yield
    finally:
        deterministic, warn_only, benchmark, cudnn_det, tf32, workspace = saved
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.backends.cudnn.benchmark = benchmark
        torch.backends.cudnn.deterministic = cudnn_det
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32[:2]
        torch.set_float32_matmul_precision(tf32[2])
        if workspace is None:
            os.environ.pop(CUBLAS_WORKSPACE_ENV, None)
        else:
            os.environ[CUBLAS_WORKSPACE_ENV] = workspace
