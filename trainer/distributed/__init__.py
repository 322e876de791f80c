"""One run over many ranks, the trainer's one seam to them (docs/distributed.md):
torchrun's environment, the process group and the reductions that keep every
global statistic global (``context``), and sharding: FSDP2, expert parallelism,
gradients and state dicts over shards (``sharding``). Everything is importable
from ``trainer.distributed``.
"""

from trainer.distributed.context import (
    SINGLE,
    TORCHRUN_ENV,
    DistContext,
    DistributedSetupError,
    average_gradients,
    global_grad_norm,
    init_distributed,
    launched_world_size,
    rank_device,
    sharded_grad_norm,
    shutdown_distributed,
)
from trainer.distributed.sharding import (
    full_state_dict,
    load_local_optimizer_state,
    load_rank_state_dict,
    local_optimizer_state,
    rank_state_dict,
    shard_model,
    shard_model_experts,
)

__all__ = [
    "SINGLE",
    "TORCHRUN_ENV",
    "DistContext",
    "DistributedSetupError",
    "average_gradients",
    "full_state_dict",
    "global_grad_norm",
    "init_distributed",
    "launched_world_size",
    "load_local_optimizer_state",
    "load_rank_state_dict",
    "local_optimizer_state",
    "rank_device",
    "rank_state_dict",
    "shard_model",
    "shard_model_experts",
    "sharded_grad_norm",
    "shutdown_distributed",
]
