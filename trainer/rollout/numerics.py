"""The rollout engine's precision: fp32, bf16 or fp16.

On CUDA, bf16/fp16 are native: weights and activations are stored in the
half dtype and every matmul runs on half inputs (with fp32 accumulation inside
the GEMM), as in vLLM/SGLang.

On CPU, native bf16 matmuls run 5-20x slower than fp32, so half precision is
EMULATED: weights are rounded to the half dtype once at load, and every
activation a GPU engine would store in half (matmul outputs, residual stream,
norm outputs, attention outputs, router input AND router logits) is rounded
with ``x.to(half).to(fp32)``. Matmuls then run in fp32 on half-representable
inputs, which is what a GPU half GEMM with fp32 accumulation computes, up to
summation order. Router logits rounded to half before the fp32 softmax are
what makes near-tied experts flip relative to the fp32 training router.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Numerics:
    def __init__(self, precision: str, device: torch.device | str = "cpu"):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, not {precision!r}")
        self.precision = precision
        self.device = torch.device(device)
        self.half = PRECISIONS[precision]
        self.native = self.device.type == "cuda" and precision != "fp32"
        self.emulated = not self.native and precision != "fp32"
        # dtype tensors are stored in: the half dtype when native, else fp32
        self.dtype = self.half if self.native else torch.float32

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """Bring x to what the engine stores: half-rounded (emulated) or half (native)."""
        if self.emulated:
            return x.to(self.half).to(torch.float32)
        return x.to(self.dtype)

    def round_(self, x: torch.Tensor) -> torch.Tensor:
        """``round`` that may overwrite x: for fresh temporaries only.

        Emulated, x is rounded in place (one half-size temporary instead of a
        second full-size fp32 tensor); the bits equal ``round(x)``.
        """
        if self.emulated:
            return x.copy_(x.to(self.half))
        return x.to(self.dtype)

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        return self.round(w.detach().to(self.device, torch.float32))

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x @ w.T on stored (already rounded) operands; output rounded like a half GEMM's."""
        return self.round_(F.linear(x, w))

    def __repr__(self) -> str:
        mode = "native" if self.native else ("emulated" if self.emulated else "full")
        return f"Numerics({self.precision}, {mode}, {self.device})"
