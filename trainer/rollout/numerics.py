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
training through the fp8 layers below them).

fp8 GEMMs are NATIVE or EMULATED per GEMM group, chosen once per engine from
the device's capability (``trainer.rollout.fp8.choose_fp8_plan``; recorded as
``fp8_mode``): native ones run ``torch._scaled_mm`` / ``torch._scaled_grouped_mm``
on e4m3 operands and write bf16; emulated ones run in fp32 on the same
e4m3-rounded operands. On CUDA, an engine whose projections are native stores
its activations in bf16 (as a native bf16 engine does); otherwise fp8 storage
is emulated bf16 in fp32 tensors, the CPU's reference (also when a test forces
native GEMMs on the CPU: only the GEMMs change then).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.devices import capability as device_props
from trainer.devices.dtypes import DTYPES
from trainer.model.dispatch import Dispatch, expert_matmul
from trainer.rollout.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    Fp8Experts,
    Fp8Plan,
    Fp8Weight,
    cat_out_features,
    choose_fp8_plan,
    fp8_round,
    scaled_grouped,
    scaled_linear,
)

PRECISIONS = DTYPES  # rollout.precision: fp32 | bf16 | fp16 (fp8 below)
# fp8: activations stored in bf16 (the half dtype below), GEMM operands in e4m3.
STORAGE = {**PRECISIONS, "fp8": torch.bfloat16}
__all__ = ["FP8_DTYPE", "FP8_MAX", "PRECISIONS", "STORAGE", "Numerics", "fp8_round"]


class Numerics:
    """The engine's precision: storage dtype, rounding, and its GEMMs.

    fp8_gemm: ``auto`` (by capability), ``native`` or ``emulated``, for fp8 only;
    ``native`` on the CPU is for tests and benches (``choose_fp8_plan``).
    """

    def __init__(self, precision: str, device: torch.device | str = "cpu", fp8_gemm: str = "auto"):
        if precision not in STORAGE:
            raise ValueError(f"precision must be one of {sorted(STORAGE)}, not {precision!r}")
        if precision != "fp8" and fp8_gemm != "auto":
            raise ValueError(f"fp8_gemm={fp8_gemm!r} needs precision 'fp8', not {precision!r}")
        self.precision = precision
        self.device = torch.device(device)
        self.half = STORAGE[precision]
        self.fp8 = precision == "fp8"
        cuda = self.device.type == "cuda"
        self.fp8_plan: Fp8Plan | None = None
        if self.fp8:
            capability = device_props.device_capability(self.device)
            self.fp8_plan = choose_fp8_plan(self.device.type, capability, fp8_gemm)
        self.fp8_projections = self.fp8 and self.fp8_plan.projections == "native"
        self.fp8_experts = self.fp8 and self.fp8_plan.experts == "native"
        half_native = precision in PRECISIONS and precision != "fp32"
        self.native = cuda and (half_native or self.fp8_projections)
        self.emulated = not self.native and precision != "fp32"
        # dtype tensors are stored in: the half dtype when native, else fp32
        self.dtype = self.half if self.native else torch.float32

    @property
    def fp8_mode(self) -> str | None:
        """``native``, ``native-dense+emulated-experts`` or ``emulated``; None unless fp8."""
        return None if self.fp8_plan is None else self.fp8_plan.label()

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

    def gemm_weight(self, w: torch.Tensor, name: str = "weight") -> torch.Tensor | Fp8Weight:
        """A projection GEMM's weight w (out, in): e4m3 with one scale under fp8
        (an ``Fp8Weight`` when native; ``name`` labels a refused shape), else ``weight``."""
        if not self.fp8:
            return self.weight(w)
        w = w.detach().to(self.device, torch.float32)
        return Fp8Weight.from_float(w, name) if self.fp8_projections else fp8_round(w)

    def expert_weight(self, w: torch.Tensor) -> torch.Tensor | Fp8Experts:
        """Stacked experts (E, in, out) under fp8: e4m3, one scale per expert."""
        w = w.detach().to(self.device, torch.float32)
        return Fp8Experts.from_float(w) if self.fp8_experts else fp8_round(w, (1, 2))

    def expert_weights(self, name: str, *parts: torch.Tensor) -> torch.Tensor | Fp8Experts:
        """fp8 expert weights (E, in, out_i), each part with its own per-expert scale,
        side by side on the output features (gate | up: one grouped GEMM)."""
        out = self.expert_weight(parts[0])
        for part in parts[1:]:
            out = cat_out_features(out, self.expert_weight(part))
        return out.check(name) if isinstance(out, Fp8Experts) else out

    def gemm_input(self, x: torch.Tensor) -> torch.Tensor:
        """A projection GEMM's input activation: e4m3 with a dynamic per-tensor scale under fp8."""
        return fp8_round(x) if self.fp8 else x

    def linear(self, x: torch.Tensor, w: torch.Tensor | Fp8Weight, fp8: bool = True):
        """x @ w.T on stored (already rounded) operands; output rounded like a half GEMM's.

        ``fp8=False`` for the GEMMs fp8 engines keep in high precision (router, LM head).
        A native ``Fp8Weight`` runs ``torch._scaled_mm`` (bf16 out, stored as is).
        """
        if isinstance(w, Fp8Weight):
            return scaled_linear(x, w).to(self.dtype)
        if fp8:
            x = self.gemm_input(x)
        return self.round_(F.linear(x, w))

    def expert_input(self, x: torch.Tensor) -> torch.Tensor:
        """Rows entering a grouped expert GEMM: fp8-rounded when the experts are
        emulated fp8; as stored when native (the kernel call quantizes them)."""
        return x if self.fp8_experts else self.gemm_input(x)

    def expert_linear(self, x, w, groups: Dispatch, backend: str) -> torch.Tensor:
        """Grouped GEMM of ``expert_input`` rows x (M, in) sorted by expert with
        w (E, in, out) -> (M, out) stored: ``torch._scaled_grouped_mm`` when native."""
        if isinstance(w, Fp8Experts):
            return scaled_grouped(x, w, groups.offsets).to(self.dtype)
        return self.round_(expert_matmul(x, w, groups, backend))

    def __repr__(self) -> str:
        mode = "native" if self.native else ("emulated" if self.emulated else "full")
        fp8 = f", fp8 GEMMs {self.fp8_mode}" if self.fp8 else ""
        return f"Numerics({self.precision}, {mode}{fp8}, {self.device})"
