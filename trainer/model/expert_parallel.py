"""Expert parallelism: one MoE layer's experts sharded over the ranks of a group,
tokens sent to their experts' rank and back with ``all_to_all_single``.

Rank r of an ``ep_size`` group owns the contiguous experts
``[r * E / ep_size, (r + 1) * E / ep_size)`` (GShard / Megatron layout). Per
layer forward (docs/distributed.md):

    1. route locally (the router is replicated): top-k ids, gates  (N, k)
    2. sort the N*k assignments by expert id: experts of rank 0 first, ...
    3. all_to_all the per-expert counts, then the token rows (variable splits)
    4. run the local experts' SwiGLU on what arrived (grouped matmul)
    5. all_to_all the results back (the inverse splits), unsort, gate-weighted sum

Both all_to_alls are differentiable: the backward of a send with splits (s, r)
is the send of the gradients with splits (r, s). Expert gradients therefore
collect the contributions of every rank's tokens on the owning rank (a sum, as
in the single-process layer over all tokens); router gradients stay per rank.
An expert (or a whole rank) that receives no token sends and gets empty splits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.model.dispatch import Dispatch


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows with variable splits, differentiable."""

    @staticmethod
    def forward(ctx, x, send_splits: list[int], recv_splits: list[int], group):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        out = x.new_empty((sum(recv_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        out = grad.new_empty((sum(send_splits), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), send_splits, recv_splits, group=ctx.group)
        return out, None, None, None


def all_to_all_rows(x, send_splits: list[int], recv_splits: list[int], group=None):
    """Rows ``x[:send_splits[0]]`` to rank 0, the next ``send_splits[1]`` to rank 1, ...;
    returns the rows received, ``recv_splits[s]`` from rank s, in rank order."""
    return _AllToAll.apply(x, send_splits, recv_splits, group)


@dataclass(frozen=True)
class ExpertShard:
    """Where a sharded MoE layer's experts live: this rank's place in its
    expert-parallel group (``group`` None = the default group) and the global count."""

    rank: int
    size: int
    n_experts: int
    group: Any = None

    @property
    def n_local(self) -> int:
        return self.n_experts // self.size

    @property
    def local(self) -> slice:
        return slice(self.rank * self.n_local, (self.rank + 1) * self.n_local)


def shard_experts_(layer: nn.Module, rank: int, size: int, group=None) -> nn.Module:
    """Keep only this rank's experts of an ``MoELayer`` (in place): the stacked
    ``experts.w_*`` become their ``[rank*E/size, (rank+1)*E/size)`` slices (same
    parameter names, so optimiser groups, per-expert clipping and checkpoints find
    them) and ``layer.expert_shard`` makes the forward exchange tokens. Every
    rank must start from the same full layer (same seed or checkpoint)."""
    if layer.n_experts % size:
        raise ValueError(f"{layer.n_experts} experts do not split over {size} ranks")
    shard = ExpertShard(rank, size, layer.n_experts, group)
    experts = layer.experts
    for name in expert_tensor_names(experts):
        full = getattr(experts, name)
        setattr(experts, name, nn.Parameter(full.detach()[shard.local].clone()))
    layer.expert_shard = shard
    return layer


def ep_experts_swiglu(
    x: torch.Tensor,
    gates: torch.Tensor,
    indices: torch.Tensor,
    experts: Callable[[torch.Tensor, Dispatch], torch.Tensor],
    shard: ExpertShard,
) -> torch.Tensor:
    """``experts_swiglu`` with the experts sharded: x (N, D), gates/indices (N, k)
    with GLOBAL expert ids; ``experts(xs, local)`` runs this rank's E/ep experts
    (``ExpertWeights.forward``) on rows grouped by local expert -> (N, D)."""
    n, k = indices.shape
    dispatch = Dispatch.from_indices(indices, shard.n_experts)  # sorted by expert = by rank
    ys_out = run_on_owners(x.index_select(0, dispatch.token), dispatch.counts, shard, experts)
    per_token = ys_out.index_select(0, dispatch.inverse).view(n, k, -1)
    return torch.bmm(gates.to(per_token.dtype)[:, None, :], per_token).squeeze(1)


def run_on_owners(
    rows: torch.Tensor,
    counts: torch.Tensor,
    shard: ExpertShard,
    local_ffn: Callable[[torch.Tensor, Dispatch], torch.Tensor],
) -> torch.Tensor:
    """Each row computed by its expert's rank, returned in ``rows``' order.

    rows: (M, D) this rank's assignment rows sorted by GLOBAL expert id (hence by
    owning rank); counts: (E,) rows per expert. ``local_ffn(xs, local)`` runs
    this rank's E/ep experts on rows grouped by local expert (``local.counts``:
    (E/ep,)). Training (``ep_experts_swiglu``) and the rollout engine's prefill
    and decode share it; both exchanges are differentiable.
    """
    ep, n_local = shard.size, shard.n_local
    # Per (destination rank, local expert) counts out; per (source rank, local expert) in.
    counts_out = counts.to(torch.int64)
    counts_in = torch.empty_like(counts_out)
    dist.all_to_all_single(counts_in, counts_out, group=shard.group)
    send = counts_out.view(ep, n_local).sum(1).tolist()
    recv_by_source = counts_in.view(ep, n_local)
    recv = recv_by_source.sum(1).tolist()
    arrived = all_to_all_rows(rows, send, recv, shard.group)
    # Arrived grouped by source rank, then local expert: regroup by local expert.
    expert_of_row = torch.repeat_interleave(
        torch.arange(n_local, device=rows.device).repeat(ep), recv_by_source.reshape(-1)
    )
    order = torch.argsort(expert_of_row, stable=True)
    local_counts = recv_by_source.sum(0)
    local = Dispatch(
        order=order,
        inverse=order,  # unused by expert_matmul
        token=order,
        counts=local_counts,
        offsets=local_counts.cumsum(0).to(torch.int32),
    )
    ys = local_ffn(arrived.index_select(0, order), local)
    back = torch.zeros_like(ys).index_copy(0, order, ys)  # source-rank order again
    return all_to_all_rows(back, recv, send, shard.group)  # the rows this rank sent


def all_finished(finished: torch.Tensor, shard: ExpertShard | None) -> bool:
    """Whether decoding may stop: every row here, and under expert parallelism
    every row of every rank of the group (the exchange is a collective, so the
    group decodes in lockstep until its last rank is done)."""
    if shard is None:
        return bool(finished.all())
    done = torch.tensor([int(bool(finished.all()))], device=finished.device)
    dist.all_reduce(done, op=dist.ReduceOp.MIN, group=shard.group)
    return bool(done.item())


def gather_expert_shards(state: dict[str, torch.Tensor], shard_of: dict[str, ExpertShard]):
    """A full state_dict from this rank's: every sharded expert tensor all-gathered
    over its group and concatenated on the expert dim (a collective)."""
    out = dict(state)
    for name, shard in shard_of.items():
        parts = [torch.empty_like(state[name]) for _ in range(shard.size)]
        dist.all_gather(parts, state[name].contiguous(), group=shard.group)
        out[name] = torch.cat(parts)
    return out


def expert_tensor_names(experts: nn.Module) -> list[str]:
    """The stacked per-expert tensors of an ``ExpertWeights`` (expert on dim 0): the
    SwiGLU weights and, where the experts have them (GPT-OSS), their biases."""
    names = ["w_gate", "w_up", "w_down"]
    if getattr(experts, "b_gate", None) is not None:
        names += ["b_gate", "b_up", "b_down"]
    return names


def expert_shards(model: nn.Module) -> dict[str, ExpertShard]:
    """State-dict key -> shard of every sharded expert tensor of ``model``."""
    out: dict[str, ExpertShard] = {}
    for prefix, module in model.named_modules():
        shard = getattr(module, "expert_shard", None)
        if shard is not None:
            for name in expert_tensor_names(module.experts):
                out[f"{prefix}.experts.{name}"] = shard
    return out


def slice_expert_shards(state: dict[str, torch.Tensor], shard_of: dict[str, ExpertShard]):
    """The inverse of ``gather_expert_shards``: this rank's slices of a full state_dict."""
    out = dict(state)
    for name, shard in shard_of.items():
        out[name] = state[name][shard.local]
    return out
