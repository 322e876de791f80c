"""FP8 (e4m3) GEMMs of the rollout engine: the one quantization formula, real
``torch._scaled_mm`` GEMMs where they run, and the choice of which GEMMs do.

Quantization (one formula, used by both paths): a tensor is divided by its
scale ``amax / 448`` (448 = the largest finite e4m3 value, so nothing
saturates) and cast to e4m3, round to nearest even. ``fp8_round`` brings the
result back to fp32 (``q * scale``): the EMULATED path runs its GEMMs in fp32
on such operands. The NATIVE path hands the e4m3 tensor and its fp32 scale to
torch's scaled GEMMs, which multiply e4m3 operands, accumulate, apply both
scales and write bf16.

Native layouts, fixed at load so no GEMM copies a weight:

* a projection ``Fp8Weight``: data (N, K) e4m3 row-major, so ``data.t()`` is
  the column-major (K, N) second operand ``torch._scaled_mm`` needs on CUDA;
  one fp32 scale per tensor.
* stacked experts ``Fp8Experts``: data (E, N, K) e4m3, ``data.transpose(1, 2)``
  the column-major (E, K, N) operand of ``torch._scaled_grouped_mm``; its
  kernel takes row-wise scales only, so the per-expert scale is stored
  repeated over the N output columns, (E, N) fp32 (the gate and up halves of a
  fused gate|up keep their own per-expert scales side by side).

The CUDA kernels need K and N to be multiples of 16 (and row-major first,
column-major second operands). A shape that breaks that is refused at load
with the tensor's name (``Fp8ShapeError``), on every device the native path
runs on, so a CPU test fails where an H100 would.

Which GEMMs are native is chosen once per engine (``choose_fp8_plan``) from
the device's capability (trainer.devices.capability) and recorded in
summary.json (trainer.devices.run_mode): projections native where
``torch._scaled_mm`` has an e4m3 kernel (CUDA sm89 and later), routed experts
native where ``torch._scaled_grouped_mm`` has one (CUDA sm90 and sm100 only),
emulated otherwise, and the label says so. The router and the LM head are
never fp8 (bf16, as in FP8 MoE serving).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.devices import capability as device_props

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_OUT = torch.bfloat16  # what the native GEMMs write
FP8_GEMM_MODES = ("auto", "native", "emulated")
NATIVE_MULTIPLE = 16  # K and N of every native GEMM (torch's CUDA checks)

# Module attributes so a test can stand in a reference kernel on a CPU machine.
_scaled_mm = getattr(torch, "_scaled_mm", None)
_scaled_grouped_mm = getattr(torch, "_scaled_grouped_mm", None)


class Fp8ShapeError(ValueError):
    """A GEMM of this shape cannot run on the native e4m3 kernels."""


def quantize(
    x: torch.Tensor, dims: tuple[int, ...] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (q, scale): q = x / scale in e4m3 (x's shape), scale = amax / 448 in fp32.

    ``dims`` are the dimensions one scale covers (None: the whole tensor, a
    0-dim scale; else the scale keeps those dims as size 1). An all-zero slice
    keeps scale 1. No host read: the scale stays on x's device.
    """
    x = x.float()  # the division must be fp32: a bf16 quotient would round twice
    amax = x.abs().amax() if dims is None else x.abs().amax(dim=dims, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x / scale).to(FP8_DTYPE), scale


def fp8_round(x: torch.Tensor, dims: tuple[int, ...] | None = None) -> torch.Tensor:
    """x rounded through e4m3 with scale amax / 448, back in fp32 (same shape):
    ``(x / s).to(float8_e4m3fn).to(float32) * s`` (``quantize``)."""
    q, scale = quantize(x, dims)
    return q.to(torch.float32) * scale


def check_native_shape(name: str, n: int, k: int) -> None:
    """Raise ``Fp8ShapeError`` unless an (N out, K in) GEMM fits the e4m3 kernels."""
    bad = {dim: size for dim, size in (("out", n), ("in", k)) if size % NATIVE_MULTIPLE}
    if bad:
        sizes = ", ".join(f"{dim} features {size}" for dim, size in bad.items())
        raise Fp8ShapeError(
            f"{name}: {sizes} not a multiple of {NATIVE_MULTIPLE}, which torch's e4m3 "
            "GEMM kernels need; this model cannot run native fp8 GEMMs "
            "(use fp8_gemm='emulated', or a model whose widths are multiples of 16)"
        )


@dataclass
class Fp8Weight:
    """A projection's weight for ``torch._scaled_mm``: data (N, K) e4m3 row-major,
    scale () fp32 (one per tensor)."""

    data: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def from_float(cls, w: torch.Tensor, name: str = "weight") -> Fp8Weight:
        """w: (N, K) as the checkpoint stores an nn.Linear weight."""
        check_native_shape(name, *w.shape)
        q, scale = quantize(w)
        return cls(q.contiguous(), scale)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantize(self) -> torch.Tensor:
        """(N, K) fp32: what the emulated path stores (``fp8_round(w)``)."""
        return self.data.to(torch.float32) * self.scale


@dataclass
class Fp8Experts:
    """Stacked expert weights for ``torch._scaled_grouped_mm``: data (E, N, K) e4m3,
    scale (E, N) fp32 (each expert's one scale, repeated over its output columns)."""

    data: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def from_float(cls, w: torch.Tensor) -> Fp8Experts:
        """w: (E, K, N) as the checkpoint stores experts (x @ w[e]); one scale per expert.
        Shapes are checked by the caller on the final (fused) tensor."""
        q, scale = quantize(w, dims=(1, 2))  # scale (E, 1, 1)
        e, _, n = w.shape
        return cls(q.transpose(1, 2).contiguous(), scale.view(e, 1).expand(e, n).contiguous())

    @property
    def shape(self) -> torch.Size:
        """The logical (E, K, N) shape, as the emulated weight has it."""
        e, n, k = self.data.shape
        return torch.Size((e, k, n))

    def check(self, name: str) -> Fp8Experts:
        _, n, k = self.data.shape
        check_native_shape(name, n, k)
        return self

    def dequantize(self) -> torch.Tensor:
        """(E, K, N) fp32: what the emulated path stores."""
        return (self.data.to(torch.float32) * self.scale[:, :, None]).transpose(1, 2)


def cat_out_features(a, b):
    """Two expert weights side by side on their output features (gate | up), each
    keeping its own per-expert scale: (E, K, N1) + (E, K, N2) -> (E, K, N1 + N2)."""
    if isinstance(a, Fp8Experts):
        return Fp8Experts(torch.cat((a.data, b.data), 1), torch.cat((a.scale, b.scale), 1))
    return torch.cat((a, b), dim=2)


def scaled_linear(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """x (..., K) any float dtype -> x @ w.T (..., N) in bf16 through ``torch._scaled_mm``.

    x gets a dynamic per-tensor scale (``quantize``, on the device); the GEMM
    multiplies e4m3 operands with fp32 accumulation (``use_fast_accum=False``)
    and applies both scales before the one bf16 rounding of the output.
    """
    k = x.shape[-1]
    q, scale = quantize(x.reshape(-1, k))
    y = _scaled_mm(q.contiguous(), w.data.t(), scale, w.scale, out_dtype=FP8_OUT)
    return y.view(*x.shape[:-1], y.shape[-1])


def scaled_grouped(x: torch.Tensor, w: Fp8Experts, offsets: torch.Tensor) -> torch.Tensor:
    """Grouped GEMM of rows sorted by expert: x (M, K), offsets (E,) int32 cumulative
    row ends -> (M, N) bf16 through ``torch._scaled_grouped_mm``.

    One dynamic per-tensor scale for all rows, passed as the (M,) row-wise
    scale the kernel takes (the same value on every row: an expand, no copy of x).
    """
    q, scale = quantize(x)
    rows = scale.expand(x.shape[0]).contiguous()
    return _scaled_grouped_mm(
        q.contiguous(), w.data.transpose(1, 2), rows, w.scale, offs=offsets, out_dtype=FP8_OUT
    )


@dataclass(frozen=True)
class Fp8Plan:
    """Which fp8 GEMMs run on real e4m3 kernels: ``"native"`` or ``"emulated"`` for
    the projections (attention qkv/out, dense FFN, shared expert) and for the
    routed experts. The router and the LM head stay bf16 either way."""

    projections: str
    experts: str

    def label(self, moe: bool = True) -> str:
        """``native``, ``native-dense+emulated-experts`` or ``emulated`` (a model
        without routed experts has no expert GEMM to emulate)."""
        if self.projections == "emulated":
            return "emulated"
        if not moe or self.experts == "native":
            return "native"
        return "native-dense+emulated-experts"

    def gemms(self, moe: bool = True) -> dict[str, str]:
        out = {"projections": self.projections, "router": "bf16", "lm_head": "bf16"}
        if moe:
            out["experts"] = self.experts
        return out


def scaled_mm_runs(device_type: str, capability: tuple[int, int] | None) -> bool:
    """Whether ``torch._scaled_mm`` takes e4m3 operands here (CPU: torch has a
    kernel, a reference, never chosen by ``auto``)."""
    if _scaled_mm is None:
        return False
    return device_type == "cpu" or (device_type == "cuda" and device_props.has_fp8_gemm(capability))


def scaled_grouped_mm_runs(device_type: str, capability: tuple[int, int] | None) -> bool:
    """Whether ``torch._scaled_grouped_mm`` has a kernel here (CUDA sm90/sm100 only)."""
    return (
        _scaled_grouped_mm is not None
        and device_type == "cuda"
        and device_props.has_fp8_grouped_gemm(capability)
    )


def choose_fp8_plan(
    device_type: str, capability: tuple[int, int] | None, requested: str = "auto"
) -> Fp8Plan:
    """The fp8 GEMM plan for a device (module docstring).

    ``auto``: native wherever the kernel exists on CUDA; always emulated off
    CUDA (the CPU's emulation is the reference). ``native`` (tests and benches):
    the projections native wherever ``torch._scaled_mm`` runs, the CPU included,
    and an error where it does not; the experts native only where the grouped
    kernel exists (the label says when they are not). ``emulated``: none.
    """
    if requested not in FP8_GEMM_MODES:
        raise ValueError(f"fp8_gemm must be one of {FP8_GEMM_MODES}, not {requested!r}")
    emulated = Fp8Plan("emulated", "emulated")
    if requested == "emulated" or (requested == "auto" and device_type != "cuda"):
        return emulated
    dense = scaled_mm_runs(device_type, capability)
    if requested == "native" and not dense:
        where = device_props.capability_label(capability) if device_type == "cuda" else device_type
        raise ValueError(
            f"fp8_gemm='native': torch._scaled_mm has no e4m3 kernel on {where} "
            "(CUDA needs capability >= 8.9); use 'auto' or 'emulated'"
        )
    if not dense:
        return emulated
    grouped = scaled_grouped_mm_runs(device_type, capability)
    return Fp8Plan("native", "native" if grouped else "emulated")
