"""The rollout engine's precision: fp32, bf16, fp16 or fp8 (e4m3).

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

fp8 follows FP8 (e4m3) inference as deployed for MoE rollouts (per-tensor
"W8A8" as in vLLM's fp8 mode and the DeepSeek-V3 report's GEMMs, here with
one scale per tensor, or per expert for stacked expert weights): the weights
of every projection GEMM (attention qkv/out, FFN, experts, shared experts) are
rounded once at load through e4m3 with scale amax / 448 (448 = the largest
finite e4m3 value), and each such GEMM's INPUT activation is rounded through
e4m3 with a dynamic per-tensor scale computed from that activation. Everything
else stays bf16, as in those engines: the residual stream, norms, GEMM
outputs, the embedding table, the LM head and the router (router GEMMs are
kept in high precision in FP8 MoE inference; their inputs differ from
training through the fp8 layers below them). fp8 is always emulated: the
GEMMs run in fp32 on e4m3-representable operands.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.devices.dtypes import DTYPES

PRECISIONS = DTYPES  # rollout.precision: fp32 | bf16 | fp16 (fp8 below)
# fp8: activations stored in bf16 (the half dtype below), GEMM operands in e4m3.
STORAGE = {**PRECISIONS, "fp8": torch.bfloat16}
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def fp8_round(x: torch.Tensor, dims: tuple[int, ...] | None = None) -> torch.Tensor:
    """x rounded through e4m3 with scale amax / 448, back in fp32 (same shape).

    ``dims`` are the dimensions one scale covers (None: the whole tensor, a
    per-tensor scale). An all-zero slice keeps scale 1. The e4m3 cast rounds
    to nearest even and the scale maps amax onto 448, so nothing saturates:
    ``fp8_round(x) == (x / s).to(float8_e4m3fn).to(float32) * s``.
    """
    x = x.float()
    amax = x.abs().amax() if dims is None else x.abs().amax(dim=dims, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x / scale).to(FP8_DTYPE).to(torch.float32) * scale


class Numerics:
    def __init__(self, precision: str, device: torch.device | str = "cpu"):
        if precision not in STORAGE:
            raise ValueError(f"precision must be one of {sorted(STORAGE)}, not {precision!r}")
        self.precision = precision
        self.device = torch.device(device)
        self.half = STORAGE[precision]
        self.fp8 = precision == "fp8"
        self.native = self.device.type == "cuda" and precision in PRECISIONS and precision != "fp32"
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

    def gemm_weight(self, w: torch.Tensor) -> torch.Tensor:
        """A projection GEMM's weight: e4m3 with its own scale under fp8, else ``weight``.

        w: (out, in) one scale; (E, in, out) stacked experts, one scale per expert.
        """
        if not self.fp8:
            return self.weight(w)
        w = w.detach().to(self.device, torch.float32)
        return fp8_round(w, None if w.dim() < 3 else tuple(range(1, w.dim())))

    def gemm_input(self, x: torch.Tensor) -> torch.Tensor:
        """A projection GEMM's input activation: e4m3 with a dynamic per-tensor scale under fp8."""
        return fp8_round(x) if self.fp8 else x

    def linear(self, x: torch.Tensor, w: torch.Tensor, fp8: bool = True) -> torch.Tensor:
        """x @ w.T on stored (already rounded) operands; output rounded like a half GEMM's.

        ``fp8=False`` for the GEMMs fp8 engines keep in high precision (router, LM head).
        """
        if fp8:
            x = self.gemm_input(x)
        return self.round_(F.linear(x, w))

    def __repr__(self) -> str:
        mode = "native" if self.native else ("emulated" if self.emulated else "full")
        return f"Numerics({self.precision}, {mode}, {self.device})"
