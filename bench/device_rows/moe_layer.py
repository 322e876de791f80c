"""Device check row ``moe_layer``: an MoE layer's forward+backward against the dense
SwiGLU with the same active parameters, the reference experts against the fused
ones (trainer/model/moe_fused.py), with MFU, and where the reference's time goes.

MFU: 6 x active parameters x tokens FLOPs (forward 2, backward 4) over the
device's dense bf16 peak. The parts, each forward+backward on its own at the
same shape: the router (fp32 logits, softmax, top-k and the gates), the three
grouped GEMMs on rows already sorted by expert (what the layer's GEMMs cost at
the kernel's own speed), and the whole experts block (permute, GEMMs, SwiGLU,
unpermute and the gate-weighted sum) of each implementation; the rest of the
reference's time beyond its GEMMs is its memory passes (the table in
moe_fused's docstring). Target: fused MFU >= 50% (the reference measured 29%
on the H200, the dense layer 68%).
"""

from __future__ import annotations

from typing import Any

import torch

from bench.common import median_device_seconds

# Dense bf16 tensor-core peaks (FLOP/s) by device name, from the vendors' data sheets
# (SXM parts; without sparsity). A device not listed gets no MFU.
BF16_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in BF16_PEAK_FLOPS.items() if key in name), None)


def _timed(fn, inputs: list[torch.Tensor], grad: torch.Tensor, device, repeats: int) -> float:
    def run():
        for t in inputs:
            t.grad = None
        fn().backward(grad)

    return median_device_seconds(run, device, repeats)


def moe_layer(ctx) -> dict[str, Any]:
    from trainer.model.dispatch import Dispatch, expert_matmul, experts_swiglu, resolve_backend
    from trainer.model.layers import SwiGLU
    from trainer.model.moe import MoELayer
    from trainer.model.moe_fused import experts_swiglu_fused

    d, experts, top_k, hidden, tokens = (
        (64, 8, 2, 128, 256) if ctx.dry else (2048, 64, 8, 1024, 16384)
    )
    dev = ctx.device
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    moe = MoELayer(d, experts, top_k, hidden).to(dev, dtype)
    dense = SwiGLU(d, top_k * hidden).to(dev, dtype)
    x = torch.randn(8, tokens // 8, d, device=dev, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    repeats = 2 if ctx.dry else 10
    e = moe.experts
    seconds: dict[str, float] = {}
    for kind in ("reference", "fused"):
        moe.layer_kind = kind
        seconds[f"moe_{kind}"] = _timed(lambda: moe(x)[0], [x], grad, dev, repeats)
    seconds["dense_active"] = _timed(lambda: dense(x), [x], grad, dev, repeats)

    # the parts, at the same shape
    flat = x.detach().reshape(-1, d).requires_grad_(True)
    gflat = grad.reshape(-1, d)
    with torch.no_grad():
        _, _scores, natural = moe.router(flat)
    gates = torch.softmax(torch.randn(tokens, top_k, device=dev), -1).requires_grad_(True)
    backend = resolve_backend(e.backend, flat, (d, hidden))
    seconds["router"] = _timed(
        lambda: moe.router(flat)[1].gather(-1, natural).sum(-1, keepdim=True) * flat,
        [flat], gflat, dev, repeats,
    )  # fmt: skip
    for name, fn in (
        ("experts_reference", experts_swiglu),
        ("experts_fused", experts_swiglu_fused),
    ):
        seconds[name] = _timed(
            lambda fn=fn: fn(flat, gates, natural, e.w_gate, e.w_up, e.w_down, backend),
            [flat, gates], gflat, dev, repeats,
        )  # fmt: skip
    dispatch = Dispatch.from_indices(natural, experts)
    xs = flat.detach().index_select(0, dispatch.token).requires_grad_(True)

    def gemms():
        h = expert_matmul(xs, e.w_gate, dispatch, backend) * expert_matmul(
            xs, e.w_up, dispatch, backend
        )
        return expert_matmul(h, e.w_down, dispatch, backend)

    seconds["grouped_gemms"] = _timed(gemms, [xs], torch.randn_like(xs), dev, repeats)

    active = 3 * d * hidden * top_k + d * experts  # SwiGLU experts routed to, and the router
    flops = 6 * active * tokens  # forward 2, backward 4 FLOPs per parameter and token
    gemm_flops = 6 * 3 * d * hidden * top_k * tokens
    peak = peak_flops(dev)

    def mfu(s: float, f: float = flops) -> float | None:
        return None if peak is None else f / s / peak

    ms = {f"{k}_ms": round(1000 * v, 3) for k, v in seconds.items()}
    return {
        "status": "ran",
        "shape": {
            "d_model": d,
            "experts": experts,
            "top_k": top_k,
            "expert_hidden": hidden,
            "tokens": tokens,
            "dtype": str(dtype).removeprefix("torch."),
        },
        "backend": backend,
        **ms,
        # the device check's earlier key, kept: the reference layer
        "moe_ms": ms["moe_reference_ms"],
        "moe_over_dense": seconds["moe_reference"] / seconds["dense_active"],
        "fused_over_dense": seconds["moe_fused"] / seconds["dense_active"],
        "fused_speedup": seconds["moe_reference"] / seconds["moe_fused"],
        "mfu_moe": mfu(seconds["moe_reference"]),
        "mfu_moe_fused": mfu(seconds["moe_fused"]),
        "mfu_dense_active": mfu(seconds["dense_active"]),
        "mfu_grouped_gemms": mfu(seconds["grouped_gemms"], gemm_flops),
        "target_mfu": 0.5,
    }
