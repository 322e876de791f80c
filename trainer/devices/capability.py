"""Device properties the trainer branches on, read in one place.

``device_capability`` is the one call that asks CUDA for a compute capability,
so that a test can fake a device's properties (an sm80 A100, an sm90 H100)
and exercise every choice that depends on them on a CPU machine; the
computation itself is never faked.
"""

from __future__ import annotations

import torch


def device_capability(device: torch.device | str) -> tuple[int, int] | None:
    """(major, minor) compute capability of a CUDA device; None for any other device."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def capability_label(capability: tuple[int, int] | None) -> str:
    """``sm80``, ``sm90``, ... or ``cpu`` for a device without a CUDA capability."""
    return "cpu" if capability is None else f"sm{capability[0]}{capability[1]}"


def has_fp8_gemm(capability: tuple[int, int] | None) -> bool:
    """Whether ``torch._scaled_mm`` runs e4m3 GEMMs here: CUDA with capability >= 8.9
    (Ada, Hopper, Blackwell) and a torch that has the op."""
    return capability is not None and capability >= (8, 9) and hasattr(torch, "_scaled_mm")


# Majors with torch's e4m3 grouped GEMM: ``torch._scaled_grouped_mm`` checks for
# exactly these ("only supported on CUDA devices with compute capability = [9.0, 10.0]").
_FP8_GROUPED_GEMM_MAJORS = (9, 10)


def has_fp8_grouped_gemm(capability: tuple[int, int] | None) -> bool:
    """Whether ``torch._scaled_grouped_mm`` runs e4m3 grouped GEMMs here: CUDA sm90
    (Hopper) or sm100 (Blackwell datacenter), not sm89 nor sm120, and a torch that has it."""
    return (
        capability is not None
        and capability[0] in _FP8_GROUPED_GEMM_MAJORS
        and hasattr(torch, "_scaled_grouped_mm")
    )
