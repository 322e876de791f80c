"""One run over many ranks: torchrun's environment, the process group, and the
reductions that keep every global statistic global (docs/distributed.md).

A trainer started by ``torch.distributed.run`` (torchrun) finds ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in its
environment; ``init_distributed`` then joins the process group (NCCL on CUDA,
gloo on CPU) with a timeout on the rendezvous and on every collective, so a
rank that dies ends the run with an error instead of a hang. Without torchrun
(or with ``WORLD_SIZE=1``) it returns ``SINGLE``, whose reductions are the
identity, so a single-process run computes exactly what it always did.

The one rule for statistics: reduce SUMS and COUNTS, never a mean of per-rank
means (ranks hold unequal numbers of tokens). ``global_scale`` is the factor
that turns a rank's local mean into its share of the global mean:

    local_mean * n_local / n_global * W

summed over ranks and divided by W (what DDP / FSDP gradient averaging does)
gives sum / n_global, the single-process mean over the global batch.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# Env vars torchrun sets for every worker process.
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class DistributedSetupError(RuntimeError):
    """The launch does not match the config (e.g. WORLD_SIZE != run.gpus)."""


@dataclass(frozen=True)
class DistContext:
    """This process's place in the run; ``SINGLE`` when there is no process group.

    strategy: ``ddp`` | ``fsdp`` (``parallel.strategy``); only meaningful when
    ``world_size > 1``.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    strategy: str = "ddp"
    # Expert parallelism: consecutive ranks [i*ep, (i+1)*ep) share one MoE layer's
    # experts (ep_group); ranks with the same rank % ep hold the same experts and
    # average their gradients (dp_group).
    expert_parallel: int = 1
    ep_group: Any = None
    dp_group: Any = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes metrics.jsonl, summary.json, the log, progress and checkpoints."""
        return self.rank == 0

    @property
    def fsdp(self) -> bool:
        return self.enabled and self.strategy == "fsdp"

    @property
    def ep(self) -> bool:
        return self.enabled and self.expert_parallel > 1

    @property
    def ep_rank(self) -> int:
        return self.rank % self.expert_parallel

    # ------------------------------------------------------------------ sharding
    def shard(self, n: int) -> slice:
        """This rank's contiguous share of ``n`` items (the first ``n % W`` ranks get one more).

        Prompts are sharded whole, so a prompt's group stays on one rank.
        """
        base, extra = divmod(n, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (1 if self.rank < extra else 0))

    # ------------------------------------------------------------------ reductions
    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """All-reduce SUM of a tensor (returned as a new float64 CPU tensor when local)."""
        out = values.detach().to(torch.float64).clone()
        if self.enabled:
            device = _collective_device(self)
            out = out.to(device)
            dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.cpu()

    def max(self, values: torch.Tensor) -> torch.Tensor:
        out = values.detach().to(torch.float64).clone()
        if self.enabled:
            out = out.to(_collective_device(self))
            dist.all_reduce(out, op=dist.ReduceOp.MAX)
        return out.cpu()

    def all_true(self, flag: bool) -> bool:
        """True on every rank only when ``flag`` is True on every rank."""
        if not self.enabled:
            return flag
        return bool(self.max(torch.tensor([0.0 if flag else 1.0]))[0] == 0.0)

    def any_true(self, flag: bool) -> bool:
        if not self.enabled:
            return flag
        return bool(self.max(torch.tensor([1.0 if flag else 0.0]))[0] == 1.0)

    def global_scale(self, local_count: float | torch.Tensor) -> float:
        """``n_local * W / n_global``: multiplies a local mean into its share of the
        global mean under gradient AVERAGING over W ranks (module docstring). 1.0
        single-process; 0.0 for a rank without items; n_global == 0 gives 0."""
        if not self.enabled:
            return 1.0
        local = float(local_count)
        total = float(self.sum(torch.tensor([local]))[0])
        return local * self.world_size / total if total > 0 else 0.0

    def global_scales(self, local_counts: list[float]) -> list[float]:
        """``global_scale`` of several counts in one collective."""
        if not self.enabled:
            return [1.0] * len(local_counts)
        total = self.sum(torch.tensor(local_counts, dtype=torch.float64))
        return [
            c * self.world_size / float(t) if float(t) > 0 else 0.0
            for c, t in zip(local_counts, total, strict=True)
        ]

    def weighted_means(self, items: dict[str, tuple[float, float]]) -> dict[str, float]:
        """``{key: (local_mean, local_weight)}`` -> global weighted means, one collective.

        A key whose global weight is 0 gets 0.0 (the single-process convention of
        an empty masked mean).
        """
        if not self.enabled:
            return {key: float(mean) for key, (mean, _) in items.items()}
        keys = list(items)
        packed = torch.tensor(
            [items[k][0] * items[k][1] for k in keys] + [items[k][1] for k in keys],
            dtype=torch.float64,
        )
        total = self.sum(packed)
        sums, weights = total[: len(keys)], total[len(keys) :]
        return {
            k: float(sums[i] / weights[i]) if weights[i] > 0 else 0.0 for i, k in enumerate(keys)
        }

    def maxima(self, items: dict[str, float]) -> dict[str, float]:
        if not self.enabled:
            return dict(items)
        keys = list(items)
        total = self.max(torch.tensor([items[k] for k in keys], dtype=torch.float64))
        return {k: float(total[i]) for i, k in enumerate(keys)}

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def sync_expert_grads(self, named_params, is_expert: Any) -> None:
        """Expert parallelism without FSDP replaces DDP's gradient all-reduce
        (``average_gradients``); FSDP's reduce-scatter and DDP average on their own."""
        if self.ep and not self.fsdp:
            average_gradients(named_params, self, is_expert)

    def clip_grad_norm_(
        self, params: list[torch.Tensor], max_norm: float, named_params, is_expert: Any
    ) -> torch.Tensor:
        """Scale ``params``' gradients so the WHOLE model's L2 norm is at most
        ``max_norm`` (inf: measure only); returns that norm, a plain tensor.

        ``params`` are the tensors the optimiser steps (fp32 masters for bf16), in
        the model's parameter order (the norm's summation order). One process, DDP
        or FSDP without expert parallelism: ``clip_grad_norm_`` (a DTensor norm under
        FSDP, made whole). With expert parallelism no rank holds every gradient: the
        norm is summed over the shards (``sharded_grad_norm`` under FSDP,
        ``global_grad_norm`` otherwise) and applied as clip_grad_norm_ does,
        ``min(1, max_norm / (norm + 1e-6))``.
        """
        if self.ep:
            if self.fsdp:
                norm = sharded_grad_norm(params, self)
            else:
                norm = global_grad_norm(named_params, self, is_expert)
            scale_by = float((max_norm / (norm + 1e-6)).clamp(max=1.0))
            for p in params:
                p.grad.mul_(scale_by)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):  # FSDP: a DTensor over the shards
            norm = norm.full_tensor()
        return norm


SINGLE = DistContext()


def _collective_device(ctx: DistContext) -> torch.device:
    # NCCL reduces CUDA tensors only; gloo takes CPU ones.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def launched_world_size() -> int:
    """WORLD_SIZE set by torchrun, 1 without it."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(
    world_size_expected: int,
    device: torch.device,
    strategy: str,
    timeout_s: float,
    expert_parallel: int = 1,
) -> DistContext:
    """Join torchrun's process group, or return ``SINGLE`` when not launched by torchrun.

    ``world_size_expected`` is ``run.gpus x run.nodes`` (the worker, or each
    worker of a gang, launches run.gpus ranks);
    a different WORLD_SIZE is a launch error, not something to guess around.
    ``timeout_s`` bounds the rendezvous and every collective: a rank that died
    makes the others fail with a timeout error after that long.
    """
    world = launched_world_size()
    if world <= 1:
        return SINGLE
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        raise DistributedSetupError(
            f"WORLD_SIZE={world} but {', '.join(missing)} not set: start several ranks with "
            "torchrun (python -m torch.distributed.run --nproc_per_node=N -m trainer run ...)"
        )
    if world != world_size_expected:
        raise DistributedSetupError(
            f"torchrun started {world} ranks but run.gpus x run.nodes is {world_size_expected}; "
            "set run.gpus (ranks per node) and run.nodes to match the launch"
        )
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    ep_group = dp_group = None
    if expert_parallel > 1:
        # Every rank creates every group, in the same order (new_group is collective).
        for first in range(0, world, expert_parallel):
            group = dist.new_group(list(range(first, first + expert_parallel)))
            if first <= rank < first + expert_parallel:
                ep_group = group
        for offset in range(expert_parallel):
            group = dist.new_group(list(range(offset, world, expert_parallel)))
            if rank % expert_parallel == offset:
                dp_group = group
    return DistContext(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        strategy=strategy,
        expert_parallel=expert_parallel,
        ep_group=ep_group,
        dp_group=dp_group,
    )


def rank_device(device: torch.device, ctx: DistContext) -> torch.device:
    """Each rank owns the GPU of its LOCAL_RANK; CPU ranks share the CPU."""
    if device.type == "cuda" and ctx.enabled:
        return torch.device("cuda", ctx.local_rank)
    return device


def shutdown_distributed(ctx: DistContext, *, in_step: bool = True) -> None:
    """Leave the process group before the interpreter exits.

    ``in_step``: every rank reached this point together (the run ended normally),
    so a barrier first makes sure no rank closes its sockets while a peer still
    waits on a collective. After a failure the peers may be gone: no barrier.

    DDP/FSDP modules keep the group alive through reference cycles; collecting
    them here lets ``destroy_process_group`` free the group (and join gloo's
    threads) now, not during interpreter teardown, where destroying a group
    with live threads aborts the process (SIGABRT, "terminate called without
    an active exception") after the run's results are already written.
    """
    if not (ctx.enabled and dist.is_initialized()):
        return
    if in_step:
        # A peer that already left (failed) makes the barrier raise: nothing to wait for.
        with contextlib.suppress(RuntimeError):
            dist.barrier()
    gc.collect()
    dist.destroy_process_group()


def average_gradients(named_params, ctx: DistContext, is_expert: Any) -> None:
    """Expert parallelism replaces DDP: every gradient becomes the global-batch one.

    Each rank's loss already carries the factor ``n_local * W / n_global``. A
    replicated parameter sums its gradient over all W ranks; a sharded expert's
    gradient already holds the contributions of its expert-parallel group's
    tokens (the all-to-all backward brought them) and sums over the ranks
    holding the same experts (``dp_group``). Both then divide by W.
    """
    for name, param in named_params:
        if param.grad is None:
            continue
        if is_expert(name):
            if ctx.world_size > ctx.expert_parallel:
                dist.all_reduce(param.grad, group=ctx.dp_group)
        else:
            dist.all_reduce(param.grad)
        param.grad.div_(ctx.world_size)


def sharded_grad_norm(params, ctx: DistContext) -> torch.Tensor:
    """L2 norm of the whole model's gradient under FSDP with expert parallelism.

    Every element of every gradient lives on exactly one rank: replicated
    parameters are sharded over the world, each expert slice over the ranks that
    hold it. So the squared local shards summed over the world are the squared
    norm (torch's clip_grad_norm_ cannot mix DTensors of two meshes).
    """
    squares = torch.zeros((), dtype=torch.float64, device=_collective_device(ctx))
    for param in params:
        if param.grad is None:
            continue
        grad = param.grad
        local = grad.to_local() if hasattr(grad, "to_local") else grad
        squares += local.detach().double().square().sum().to(squares.device)
    dist.all_reduce(squares)
    return squares.sqrt().float().cpu()


def global_grad_norm(named_params, ctx: DistContext, is_expert: Any) -> torch.Tensor:
    """L2 norm of the whole model's gradient under expert parallelism: replicated
    gradients counted once, the expert shards summed over the expert group."""
    replicated = torch.zeros((), dtype=torch.float64)
    experts = torch.zeros((), dtype=torch.float64)
    for name, param in named_params:
        if param.grad is None:
            continue
        sq = param.grad.detach().double().square().sum().cpu()
        if is_expert(name):
            experts += sq
        else:
            replicated += sq
    experts = experts.to(_collective_device(ctx))  # NCCL reduces CUDA tensors only
    dist.all_reduce(experts, group=ctx.ep_group)
    return (replicated + experts.cpu()).sqrt().float()
