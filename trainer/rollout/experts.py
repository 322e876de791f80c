"""The rollout engine's FFNs: its MoE layer (routing by the training model's
formulas, dispatch sorted by expert, the expert GEMMs at the engine's precision,
expert parallelism) and the dense SwiGLU. One part of ``EngineForward``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.config import ModelConfig
from trainer.model.activations import gated_hidden
from trainer.model.dispatch import Dispatch, expert_counts, resolve_backend
from trainer.model.expert_parallel import run_on_owners
from trainer.model.routing import affinities, choice_scores, gate_weights, select_experts
from trainer.rollout.numerics import Numerics
from trainer.rollout.router_noise import RouterNoise
from trainer.rollout.weights import EngineLayer, EngineWeights


def swiglu(
    num: Numerics, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
) -> torch.Tensor:
    """Dense SwiGLU as the trainer's (three plain linears, the faster layout)."""
    gate, up = num.linear(x, w_gate), num.linear(x, w_up)
    return num.linear(num.round_(F.silu(gate).mul_(up)), w_down)


class EngineMoE:
    """An MoE layer of the engine: ``moe(x, layer)`` -> (y, natural top-k).

    backend: the expert GEMMs' backend (``trainer.model.dispatch``); router_noise:
    the routing-only dose, or None. ``slots`` (the dispatch's slot index) is kept
    between calls and grown on demand (static_decode marks it static).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        weights: EngineWeights,
        backend: str = "auto",
        router_noise: RouterNoise | None = None,
    ):
        self.cfg = cfg
        self.weights = weights
        self.num = weights.num
        self.backend = backend
        self.router_noise = router_noise
        self.slots: torch.Tensor | None = None

    def _dispatch(self, top: torch.Tensor, n_experts: int) -> Dispatch:
        """Assignments (N, k) sorted by expert: the same order as
        ``Dispatch.from_indices`` (a stable sort by expert id keeps the slot
        order within an expert) in fewer ops."""
        flat = top.view(-1)
        n = flat.numel()
        if self.slots is None or self.slots.numel() < n:
            self.slots = torch.arange(n, device=flat.device)
        slots = self.slots[:n]
        order = torch.argsort(flat, stable=True)
        # Counts by search in the sorted ids: bincount syncs on CUDA.
        counts, offsets = expert_counts(flat.index_select(0, order), n_experts)
        return Dispatch(
            order=order,
            inverse=torch.empty_like(order).scatter_(0, order, slots),
            token=order.div(top.shape[-1], rounding_mode="floor"),
            counts=counts,
            offsets=offsets,
        )

    def __call__(self, x: torch.Tensor, layer: EngineLayer) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (N, D) stored activations -> (y (N, D), natural top-k (N, k))."""
        num = self.num
        # Router input is the stored (half) activation; logits come out of a
        # half GEMM, then temperature and softmax in fp32.
        logits = num.linear(x, layer.router, fp8=False).float()
        if layer.router_bias is not None:
            logits = logits + layer.router_bias
        if layer.has_temperature:
            logits = logits / layer.router_temperature
        # The router's formulas are the training model's (trainer.model.routing).
        rc = self.cfg.router
        scores = affinities(logits, rc.score)
        perturb = None
        if self.router_noise is not None:
            # Only the choice moves; the gates below read the unperturbed scores.
            def perturb(choice: torch.Tensor) -> torch.Tensor:
                return self.router_noise.perturb(choice, x, layer.moe_index)

        bias = layer.selection_bias if layer.has_selection_bias else None
        top = select_experts(
            choice_scores(logits, bias, rc.score, perturb),
            self.cfg.top_k,
            rc.n_groups,
            rc.topk_groups,
            rc.group_score,
        )
        gates = gate_weights(scores, top, self.cfg.norm_topk_prob, rc.score, rc.scaling)

        shard = self.weights.expert_shard
        dispatch = self._dispatch(top, shard.n_experts if shard else layer.router.shape[0])
        xs = num.expert_input(x.index_select(0, dispatch.token))
        # Resolved on the rows the expert GEMMs get: under fp8 with emulated experts
        # they are fp32 even where the engine stores bf16 (trainer.rollout.numerics).
        backend = resolve_backend(self.backend, xs)

        ffn = self.cfg.expert_ffn
        plain = ffn.activation == "swiglu"

        def experts(rows: torch.Tensor, groups: Dispatch) -> torch.Tensor:
            gate_up = num.expert_linear(rows, layer.experts_gate_up, groups, backend)
            row_expert = None
            if layer.experts_gate_up_bias is not None:  # GPT-OSS
                row_expert = groups.row_experts(rows.shape[0])
                gate_up = num.round_(gate_up + layer.experts_gate_up_bias[row_expert])
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate).mul_(up) if plain else gated_hidden(gate, up, ffn)
            out = num.expert_linear(
                num.expert_input(num.round_(act)), layer.experts_down, groups, backend
            )
            if row_expert is not None:
                out = num.round_(out + layer.experts_down_bias[row_expert])
            return out

        ys = (
            experts(xs, dispatch)
            if shard is None
            else run_on_owners(xs, dispatch.counts, shard, experts)
        )
        n, k = top.shape
        per_token = ys.index_select(0, dispatch.inverse).view(n, k, -1)
        # Gate-weighted sum over the k slots. In fp32, multiply-then-sum gives
        # the same bits as the training layer's (1, k) @ (k, D) bmm (no fused
        # multiply-add there either) at a third of the cost for small batches;
        # half-precision storage keeps the bmm and its fp32 accumulation.
        if ys.dtype == torch.float32:
            y = (gates[:, :, None] * per_token).sum(1)
        else:
            y = torch.bmm(gates.to(ys.dtype)[:, None, :], per_token).squeeze(1)
        if layer.shared_gate is not None:
            shared = swiglu(num, x, layer.shared_gate, layer.shared_up, layer.shared_down)
            if layer.shared_expert_gate is not None:
                shared = num.round_(
                    torch.sigmoid(num.linear(x, layer.shared_expert_gate, fp8=False)) * shared
                )
            y = y + shared
        return num.round_(y), top
