"""Token-to-expert dispatch: sort (token, expert) assignments by expert and run
each expert's matmul on its contiguous segment, no token dropping.

Three backends compute the same grouped matmul ``out[rows of e] = x[rows of e] @ w[e]``:

* ``grouped_mm``: one ``torch.nn.functional.grouped_mm`` call (torch >= 2.10
  has a CPU kernel with autograd). On CUDA the FUSED kernel exists for bf16
  on sm90 and sm100 only; on sm80 torch runs an mm loop behind it that reads
  the group offsets on the host (a device-to-host sync per call, pytorch
  issue 186620, closed as not planned).
* ``padded``: no host sync anywhere, for every dtype and capability. Each
  expert's rows are padded to a multiple of a tile of ``T`` rows (static:
  from the row and expert counts only), so the rows form at most
  ``(M + E (T - 1)) // T`` blocks of one expert each; one ``bmm`` of the
  (blocks, T, K) rows against each block's expert weight (blocks, K, N)
  computes all experts. With ``T`` the power of two at or above M / E the
  blocks are at most 2E and the padded rows at most 2M, so the gathered
  weights are at most twice the expert weights and the FLOPs at most twice
  the routed ones, whatever the routing (MegaBlocks' block-sparse layout,
  Gale et al. 2022, with a dense bmm per block instead of a custom kernel).
* ``loop``: a Python loop over experts on contiguous segments (E matmuls,
  and ``counts.tolist()``, a host sync). The reference; used only when asked.

``auto`` picks by device, capability and dtype (``choose_backend``): the
fused ``grouped_mm`` where it exists (CPU fp32/bf16, CUDA bf16 on sm90/sm100),
``padded`` everywhere else (CUDA fp32/fp16, and bf16 on sm80). ``auto`` never
picks ``loop``, and asking for ``grouped_mm`` where torch has no kernel for the
operands is an error, not a quiet change of backend.

The expert counts come from a search in the sorted expert ids, not
``bincount`` (whose CUDA kernel reads the largest id on the host to size its
output): dispatch itself is sync-free (trainer.devices.sync_count).

Measured on the 2-core CPU with bench/bench_moe_layer.py (hidden 256, expert
width 512, 16 experts, top-2, 4096 tokens, fp32, CPU time in paired rounds):
grouped_mm forward+backward 1.55-1.7x cheaper than the loop (one kernel, and
its weight-gradient kernel avoids E separate small GEMMs), so ``auto`` picks
grouped_mm wherever it runs.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from trainer.devices import capability as device_props
from trainer.model.activations import gated_hidden

BACKENDS = ("auto", "grouped_mm", "padded", "loop")
_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
# Compute capabilities (major) with torch's fused grouped-GEMM kernel (bf16).
_FUSED_GROUPED_MM_MAJORS = (9, 10)


def grouped_mm_runs(device_type: str, dtype: torch.dtype, capability) -> bool:
    """Whether torch's grouped_mm takes these operands at all (fused or not)."""
    if _grouped_mm is None:
        return False
    if device_type == "cpu":
        return dtype in (torch.float32, torch.bfloat16)
    if device_type == "cuda":
        return dtype == torch.bfloat16 and capability is not None and capability >= (8, 0)
    return False


def fused_grouped_mm(device_type: str, dtype: torch.dtype, capability) -> bool:
    """Whether grouped_mm runs as one kernel without a host sync: the CPU kernel,
    or CUDA bf16 on a capability with the fused kernel (sm90, sm100)."""
    if not grouped_mm_runs(device_type, dtype, capability):
        return False
    return device_type == "cpu" or capability[0] in _FUSED_GROUPED_MM_MAJORS


def choose_backend(
    requested: str, device_type: str, dtype: torch.dtype, capability: tuple[int, int] | None
) -> str:
    """The backend that runs: ``requested`` unless it is ``auto`` (module docstring).

    capability: the CUDA compute capability (major, minor), None off CUDA.
    Raises ValueError for an unknown name or a ``grouped_mm`` torch cannot run here.
    """
    if requested not in BACKENDS:
        raise ValueError(f"unknown MoE backend {requested!r}; choose one of {BACKENDS}")
    if requested == "auto":
        return "grouped_mm" if fused_grouped_mm(device_type, dtype, capability) else "padded"
    if requested == "grouped_mm" and not grouped_mm_runs(device_type, dtype, capability):
        where = device_props.capability_label(capability) if device_type == "cuda" else device_type
        raise ValueError(
            f"MoE backend 'grouped_mm' has no kernel for {dtype} on {where}; use 'auto' or 'padded'"
        )
    return requested


def device_capability_of(x: torch.Tensor):
    return device_props.device_capability(x.device)


def resolve_backend(backend: str, x: torch.Tensor, widths: tuple[int, ...] = ()) -> str:
    """The backend that runs for operands like ``x`` on x's device (``auto`` resolved).

    grouped_mm's kernels need every operand row stride to be a multiple of 16
    bytes (torch: "strides should be multiple of 16 bytes"): x's width and
    ``widths`` (the weights' in/out widths, e.g. an expert's hidden size) are
    checked here, before any kernel runs; where one fails the loop backend
    runs instead and the fallback is recorded (``grouped_mm_fallbacks``).
    """
    choice = choose_backend(backend, x.device.type, x.dtype, device_capability_of(x))
    if choice == "grouped_mm":
        problem = grouped_mm_stride_problem((x.shape[-1], *widths), x.element_size())
        if problem is not None:
            _record_fallback(problem, x.dtype)
            return "loop"
    return choice


# Each distinct reason grouped_mm was replaced by the loop backend (a warning
# the first time): a run's logs say when the fast kernel did not run.
_FALLBACKS: dict[str, None] = {}


def grouped_mm_stride_problem(widths: tuple[int, ...], element_size: int) -> str | None:
    """Why grouped_mm cannot take rows of these widths (None = it can)."""
    bad = sorted({w for w in widths if (w * element_size) % 16})
    if not bad:
        return None
    return (
        f"width(s) {bad} x {element_size} bytes are not multiples of 16 bytes, which "
        "grouped_mm's row strides need"
    )


def _record_fallback(problem: str, dtype: torch.dtype) -> None:
    message = f"MoE backend grouped_mm -> loop for {dtype}: {problem}"
    if message not in _FALLBACKS:
        _FALLBACKS[message] = None
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def grouped_mm_fallbacks() -> list[str]:
    """The recorded grouped_mm -> loop fallbacks of this process, oldest first."""
    return list(_FALLBACKS)


def grouped_mm_supported(x: torch.Tensor) -> bool:
    """Whether torch's grouped_mm takes these operands on this device."""
    return grouped_mm_runs(x.device.type, x.dtype, device_props.device_capability(x.device))


def expert_counts(sorted_ids: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """counts (E,) int64 and offsets (E,) int32 (cumulative ends) of expert ids sorted
    ascending, by binary search: no host sync (``bincount`` syncs on CUDA)."""
    experts = torch.arange(n_experts, device=sorted_ids.device, dtype=sorted_ids.dtype)
    ends = torch.searchsorted(sorted_ids, experts, right=True)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    return counts, ends.to(torch.int32)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous.

    grouped_mm's backward rejects expanded (stride 0) gradients such as the one
    ``y.sum().backward()`` produces; normal layer gradients are contiguous and
    pass through untouched.
    """

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


@dataclass
class PaddedLayout:
    """Where each sorted row sits in the tile-padded block layout (``padded`` backend).

    source: (blocks * T,) row of x for each padded row; ``M`` (one past the last
    row: a zero row) on padding. dest: (M,) padded row of each sorted row.
    block_expert: (blocks,) the expert of each block. tile: T.
    """

    source: torch.Tensor
    dest: torch.Tensor
    block_expert: torch.Tensor
    tile: int

    @classmethod
    def build(cls, counts: torch.Tensor, offsets: torch.Tensor, rows: int) -> PaddedLayout:
        """counts, offsets: (E,) rows per expert and cumulative ends; rows: M (static)."""
        n_experts = counts.shape[0]
        tile = padded_tile(rows, n_experts)
        blocks = max(1, (rows + n_experts * (tile - 1)) // tile)
        dev = counts.device
        ends = offsets.to(torch.int64)
        starts = ends - counts
        padded = (counts + tile - 1) // tile * tile
        padded_ends = padded.cumsum(0)
        padded_starts = padded_ends - padded
        block_starts = torch.arange(blocks, device=dev) * tile
        # A block past the last padded segment gets the last expert: its rows are padding.
        block_expert = torch.searchsorted(padded_ends, block_starts, right=True)
        block_expert = block_expert.clamp_(max=n_experts - 1)
        row_expert = block_expert[:, None].expand(blocks, tile).reshape(-1)
        rank = torch.arange(blocks * tile, device=dev) - padded_starts[row_expert]
        source = torch.where(rank < counts[row_expert], starts[row_expert] + rank, rows)
        sorted_rows = torch.arange(rows, device=dev)
        expert_of_row = torch.searchsorted(ends, sorted_rows, right=True)
        dest = padded_starts[expert_of_row] + sorted_rows - starts[expert_of_row]
        return cls(source=source, dest=dest, block_expert=block_expert, tile=tile)


def padded_tile(rows: int, n_experts: int) -> int:
    """T: the power of two at or above rows / E, at least 8 (module docstring)."""
    per_expert = max(1, -(-rows // n_experts))
    return max(8, 1 << (per_expert - 1).bit_length())


@dataclass
class Dispatch:
    """Assignments sorted by expert.

    order: (N*k,) positions into the flattened (N, k) assignments, grouped by expert
    inverse: (N*k,) where each flattened assignment landed (order's inverse)
    token: (N*k,) token row of each sorted assignment (order // k)
    counts: (E,) assignments per expert; offsets (E,) int32 cumulative ends
    """

    order: torch.Tensor
    inverse: torch.Tensor
    token: torch.Tensor
    counts: torch.Tensor
    offsets: torch.Tensor
    _padded: PaddedLayout | None = field(default=None, repr=False)

    @classmethod
    def from_indices(cls, indices: torch.Tensor, n_experts: int) -> Dispatch:
        """indices: (N, k) expert ids per token."""
        flat = indices.reshape(-1)
        slots = torch.arange(flat.numel(), device=flat.device)
        # Unique keys make the (faster) unstable sort deterministic and stable.
        order = torch.argsort(flat * flat.numel() + slots)
        inverse = torch.empty_like(order).scatter_(0, order, slots)
        counts, offsets = expert_counts(flat.index_select(0, order), n_experts)
        return cls(
            order=order,
            inverse=inverse,
            token=order // indices.shape[-1],
            counts=counts,
            offsets=offsets,
        )

    def row_experts(self, rows: int) -> torch.Tensor:
        """(rows,) the expert of each sorted row, searched in the cumulative counts
        (no host sync); ``rows`` is the static row count M."""
        positions = torch.arange(rows, device=self.offsets.device, dtype=self.offsets.dtype)
        return torch.searchsorted(self.offsets, positions, right=True)

    def padded_layout(self, rows: int) -> PaddedLayout:
        """The ``padded`` backend's layout for ``rows`` sorted rows (built once, reused
        by the three matmuls of a SwiGLU)."""
        if self._padded is None or self._padded.dest.shape[0] != rows:
            self._padded = PaddedLayout.build(self.counts, self.offsets, rows)
        return self._padded


def padded_expert_matmul(x: torch.Tensor, w: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
    """x (M, K) sorted by expert, w (E, K, N) -> (M, N) as one bmm over blocks."""
    tile, blocks = layout.tile, layout.block_expert.shape[0]
    rows = torch.cat((x, x.new_zeros(1, x.shape[1])))  # row M: the padding source
    xp = rows.index_select(0, layout.source).view(blocks, tile, x.shape[1])
    out = torch.bmm(xp, w.index_select(0, layout.block_expert))  # (blocks, T, N)
    return out.view(blocks * tile, -1).index_select(0, layout.dest)


def expert_matmul(x: torch.Tensor, w: torch.Tensor, dispatch: Dispatch, backend: str):
    """Grouped matmul: x (M, K) sorted by expert, w (E, K, Nout) -> (M, Nout)."""
    if backend == "grouped_mm":
        problem = grouped_mm_stride_problem((x.shape[-1], w.shape[-1]), x.element_size())
        if problem is not None:  # a caller that resolved without the weights' widths
            _record_fallback(problem, x.dtype)
            backend = "loop"
    if backend == "grouped_mm":
        out = _grouped_mm(x, w, offs=dispatch.offsets)
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
        return _ContiguousGrad.apply(out) if needs_grad else out
    if backend == "padded":
        return padded_expert_matmul(x, w, dispatch.padded_layout(x.shape[0]))
    if backend != "loop":
        raise ValueError(f"unresolved MoE backend {backend!r}: call resolve_backend first")
    segments = x.split(dispatch.counts.tolist())
    return torch.cat([seg @ w[e] for e, seg in enumerate(segments)])


def experts_swiglu(
    x: torch.Tensor,
    gates: torch.Tensor,
    indices: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    backend: str = "auto",
    biases: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    activation=None,
) -> torch.Tensor:
    """Mixture of SwiGLU experts: y_t = sum_j gates[t, j] * FFN_{indices[t, j]}(x_t).

    x: (N, D); gates, indices: (N, k); w_gate, w_up: (E, D, H); w_down: (E, H, D);
    ``biases``/``activation``: see ``expert_ffn``. Returns (N, D) in x's dtype.

    Gate and up projections are separate grouped matmuls on purpose: a fused
    (E, D, 2H) projection makes a (N*k, 2H) activation whose chunk backward
    concatenates two large gradients; measured 1.22x vs 1.08x the dense-active
    FFN at the section-8 training shape.
    """
    n_experts = w_gate.shape[0]
    out_dtype = x.dtype
    # grouped_mm is not autocast-aware: apply the autocast dtype by hand so the
    # experts run in half precision like every other matmul under autocast.
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, w_gate, w_up, w_down = (t.to(dtype) for t in (x, w_gate, w_up, w_down))
    backend = resolve_backend(backend, x, widths=(w_gate.shape[-1],))
    dispatch = Dispatch.from_indices(indices, n_experts)
    xs = x.index_select(0, dispatch.token)  # (N*k, D), grouped by expert
    if biases is not None and torch.is_autocast_enabled(x.device.type):
        biases = tuple(b.to(x.dtype) for b in biases)
    ys = expert_ffn(xs, dispatch, w_gate, w_up, w_down, backend, biases, activation)
    # Back to (token, slot) order, then the gate-weighted sum over the k slots
    # as one batched (1, k) @ (k, D) product: cheaper forward and backward
    # than scaling each row and scatter-adding it (measured).
    n, k = indices.shape
    per_token = ys.index_select(0, dispatch.inverse).view(n, k, -1)
    return torch.bmm(gates.to(ys.dtype)[:, None, :], per_token).squeeze(1).to(out_dtype)


def expert_ffn(
    xs: torch.Tensor,
    dispatch: Dispatch,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    backend: str,
    biases: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    activation=None,
) -> torch.Tensor:
    """Each row's expert FFN: xs (M, D) grouped by expert (``dispatch``) -> (M, D).

    down(act(xs W_gate + b_gate, xs W_up + b_up)) + b_down, act from
    ``trainer.model.activations`` (``activation``: an ExpertFfnConfig, None = SwiGLU);
    ``biases`` (b_gate (E, H), b_up (E, H), b_down (E, D)) or None (GPT-OSS has them).
    """
    gate = expert_matmul(xs, w_gate, dispatch, backend)
    up = expert_matmul(xs, w_up, dispatch, backend)
    row_expert = None
    if biases is not None:
        row_expert = dispatch.row_experts(xs.shape[0])
        gate = gate + biases[0].index_select(0, row_expert)
        up = up + biases[1].index_select(0, row_expert)
    ys = expert_matmul(gated_hidden(gate, up, activation), w_down, dispatch, backend)
    if row_expert is not None:
        ys = ys + biases[2].index_select(0, row_expert)
    return ys
