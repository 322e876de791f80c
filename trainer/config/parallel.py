"""``parallel``: how several ranks share one run (DDP / FSDP, expert parallel)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainer.config.section import Section


class ParallelConfig(Section):
    """How the ``run.gpus`` ranks torchrun starts share one run (docs/distributed.md)."""

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="ddp: every rank holds the whole model, gradients are averaged "
        "(DistributedDataParallel); fsdp: parameters, gradients and optimizer state are "
        "sharded over the ranks (FSDP2 fully_shard, one unit per transformer block), for "
        "models that do not fit one device. Used only when run.gpus > 1.",
    )
    expert_parallel: int = Field(
        1,
        ge=1,
        le=512,
        description="Ranks each MoE layer's experts are sharded over (tokens travel to "
        "their experts' rank and back with all_to_all); 1 = off. run.gpus = data-parallel "
        "x expert_parallel; must divide model.n_experts and run.gpus. Under fsdp each rank's "
        "experts are also sharded over the ranks that hold the same experts.",
    )
    timeout_s: float = Field(
        600.0,
        ge=5.0,
        le=86_400.0,
        description="Seconds the rendezvous and every collective may wait; a rank that "
        "died makes the others fail with a timeout error after this long instead of hanging.",
    )


# Switches whose statistics are not yet reduced across ranks: rejected with run.gpus > 1.
_SINGLE_RANK_ONLY = {
    "stabilizers.surgery.enabled": "gradient surgery projects per-rank gradients",
    "stabilizers.balance.router_kl_coef": "the router-KL anchor is a per-rank marginal",
    "algorithm.advantage.ema_decay": "the reward EMA would see one rank's rewards",
    "algorithm.advantage.expert_zscore": "expert z-scores would use one rank's groups",
}
