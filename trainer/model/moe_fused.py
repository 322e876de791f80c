"""The routed experts with fewer memory passes: the fused MoE layer (``run.moe_layer``).

``trainer.model.dispatch.experts_swiglu`` (the reference) spends, besides its
three grouped GEMMs, these passes over (N k, D) or (N k, H) tensors at the
device check's shape (N = 16,384 tokens, k = 8, D = 2,048, H = 1,024, bf16:
an (N k, D) tensor is 537 MB, an (N k, H) one 268 MB), on paper:

| step | reference: bytes moved, fwd + bwd | here |
| --- | --- | --- |
| permute x -> xs (index_select) | 0.6 GB + its backward, index_add_ of 8 rows onto each token: contended atomic adds of 0.5 GB (a sort-based kernel in deterministic mode) | the same gather; backward gathers each token's k rows (inverse order) and sums them: no atomics, deterministic |
| gate and up | two grouped GEMMs reading xs twice; backward two dX GEMMs and an add of two (N k, D) results | one grouped GEMM against [W_gate, W_up] (E, D, 2H): xs read once, one dX GEMM with K = 2H; the weights concatenated per call (2 E D H, 268 MB) |
| silu(g) u | 3 passes forward, 5-6 kernels backward (silu_backward, two muls, the chunk's concatenation of two (N k, H) gradients) | one kernel each way under torch.compile on CUDA (``_swiglu``), writing the (N k, 2H) gradient in place |
| unpermute + gate-weighted sum | index_select (0.5 GB write) then a batched (1, k) @ (k, D) bmm; backward a bmm, an (N k, D) grad through index_select's backward (index_add_) | the same forward; backward one gather-and-scale of dy for dys (one pass) and the gather for the gate gradient |

Flops are the reference's; the saving is memory passes, atomics and kernel
launches, which is where the H200 measured the MoE layer at 2.31x the dense
layer with the same active parameters (29% MFU against 68%). The device check's
``moe_layer`` row times both. Used for the plain SwiGLU experts only (no expert
biases, no other activation, no expert parallelism: those take the reference),
``run.moe_layer=auto`` picks it on CUDA, the reference elsewhere (the CPU
studies' bits stay the reference's). tests/trainer/test_moe_fused.py checks it
against the reference on the CPU, forward and backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd import Function

from trainer.model.dispatch import Dispatch, expert_matmul, resolve_backend

MOE_LAYERS = ("auto", "fused", "reference")


def choose_moe_layer(requested: str, device_type: str) -> str:
    """``run.moe_layer`` resolved: ``fused`` or ``reference`` (auto: fused on CUDA)."""
    if requested not in MOE_LAYERS:
        raise ValueError(f"moe_layer must be one of {MOE_LAYERS}, not {requested!r}")
    if requested == "auto":
        return "fused" if device_type == "cuda" else "reference"
    return requested


def _swiglu_forward(gu: torch.Tensor) -> torch.Tensor:
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate) * up


def _swiglu_backward(gu: torch.Tensor, dh: torch.Tensor) -> torch.Tensor:
    """d/d[g | u] of silu(g) u: dg = dh u s (1 + g (1 - s)), du = dh silu(g), s = sigmoid(g),
    in fp32, written as one (M, 2H) tensor."""
    gate, up = gu.float().chunk(2, dim=-1)
    s = torch.sigmoid(gate)
    dhf = dh.float()
    dgate = dhf * up * s * (1 + gate * (1 - s))
    dup = dhf * gate * s
    return torch.cat((dgate, dup), dim=-1).to(gu.dtype)


_COMPILED: dict[str, object] = {}


def _kernel(name: str, fn, device_type: str):
    """``fn`` under torch.compile on CUDA (one fused Triton kernel, shapes dynamic);
    plain eager elsewhere."""
    if device_type != "cuda":
        return fn
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=True)
    return _COMPILED[name]


class _GatherRows(Function):
    """xs = x[token] (M, D); backward sums each token's k rows, found through ``inverse``
    (assignment t k + j sits at row inverse[t k + j]), instead of index_add_'s atomics."""

    @staticmethod
    def forward(ctx, x, token, inverse, k):
        ctx.save_for_backward(inverse)
        ctx.shape = (x.shape[0], k)
        return x.index_select(0, token)

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        n, k = ctx.shape
        return grad.index_select(0, inverse).view(n, k, -1).sum(1), None, None, None


class _SwiGLU(Function):
    """h = silu(g) u for gu = [g | u] (M, 2H); the backward writes d[g | u] as one tensor."""

    @staticmethod
    def forward(ctx, gu):
        ctx.save_for_backward(gu)
        return _kernel("swiglu_fwd", _swiglu_forward, gu.device.type)(gu)

    @staticmethod
    def backward(ctx, dh):
        (gu,) = ctx.saved_tensors
        return _kernel("swiglu_bwd", _swiglu_backward, gu.device.type)(gu, dh.contiguous())


class _Combine(Function):
    """y[t] = sum_j gates[t, j] ys[inverse[t k + j]] (N, D), as the reference's batched
    (1, k) @ (k, D) product; backward: dys[r] = gates at order[r] x dy[token[r]] (one
    gather and scale) and dgates[t, j] = <dy[t], ys[inverse[t k + j]]>."""

    @staticmethod
    def forward(ctx, ys, gates, dispatch_tensors):
        order, inverse, token = dispatch_tensors
        n, k = gates.shape
        per_token = ys.index_select(0, inverse).view(n, k, -1)
        ctx.save_for_backward(ys, gates, order, inverse, token)
        return torch.bmm(gates.to(ys.dtype)[:, None, :], per_token).squeeze(1)

    @staticmethod
    def backward(ctx, dy):
        ys, gates, order, inverse, token = ctx.saved_tensors
        n, k = gates.shape
        dy = dy.contiguous()
        sorted_gates = gates.reshape(-1).index_select(0, order).to(dy.dtype)
        dys = dy.index_select(0, token) * sorted_gates[:, None]
        per_token = ys.index_select(0, inverse).view(n, k, -1)
        dgates = torch.bmm(per_token, dy[:, :, None]).squeeze(-1)
        return dys, dgates.to(gates.dtype), None


def experts_swiglu_fused(
    x: torch.Tensor,
    gates: torch.Tensor,
    indices: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """``dispatch.experts_swiglu`` (no biases, SwiGLU) with the passes above.

    x: (N, D); gates, indices: (N, k); w_gate, w_up: (E, D, H); w_down: (E, H, D).
    Returns (N, D) in x's dtype."""
    n_experts, _, hidden = w_gate.shape
    out_dtype = x.dtype
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, w_gate, w_up, w_down = (t.to(dtype) for t in (x, w_gate, w_up, w_down))
    backend = resolve_backend(backend, x, widths=(2 * hidden, hidden))
    dispatch = Dispatch.from_indices(indices, n_experts)
    xs = _GatherRows.apply(x, dispatch.token, dispatch.inverse, indices.shape[1])
    gate_up = expert_matmul(xs, torch.cat((w_gate, w_up), dim=-1), dispatch, backend)
    ys = expert_matmul(_SwiGLU.apply(gate_up), w_down, dispatch, backend)
    tensors = (dispatch.order, dispatch.inverse, dispatch.token)
    return _Combine.apply(ys, gates, tensors).to(out_dtype)
