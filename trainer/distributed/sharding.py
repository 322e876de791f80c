"""Sharding over the ranks: the model wrapped for FSDP2 (``shard_model``) or its
experts split for expert parallelism, gradients averaged and clipped over
shards, and the state dicts and optimizer states a checkpoint takes from each
rank (docs/distributed.md). The process group and the reductions are
``trainer.distributed.context``'s.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.distributed.context import DistContext


def shard_model(
    model: torch.nn.Module, ctx: DistContext, param_dtype: str = "fp32"
) -> torch.nn.Module:
    """FSDP2: shard ``model`` in place over the ranks, one unit per transformer block
    plus the root (embeddings, final norm, heads).

    Each block's parameters are all-gathered just before its forward/backward and
    freed after; gradients are reduce-scattered (averaged) and the optimizer only
    ever sees this rank's shard. Works for every model the trainer builds, the
    builtin one and one imported from a Hugging Face checkpoint
    (trainer.hf.loader), because both are ``TransformerLM`` with ``.blocks``.

    ``param_dtype="bf16"`` (``optim.param_dtype``) is FSDP2's mixed precision:
    the shards stay fp32 and are the master weights the optimiser steps; each
    all-gather casts them to bf16, so forward and backward compute on bf16
    weights exactly as the single-process run's bf16 parameters (rounded from
    its fp32 masters) do, and gradients are reduced in fp32. The routers are
    units of their own that gather in fp32 (``trainer.devices.precision.keeps_fp32``).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from trainer.devices.precision import DTYPES

    device_type = next(model.parameters()).device.type
    mesh = init_device_mesh(device_type, (ctx.world_size,))
    low = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=torch.float32)
    if param_dtype != "fp32":
        fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        for layer in model.moe_layers:
            fully_shard(layer.router, mesh=mesh, mp_policy=fp32)
    if ctx.ep and any(layer.expert_shard is not None for layer in model.moe_layers):
        # Expert parallelism (shard_model_experts ran first): this rank's experts are
        # sharded over the ranks that hold the same experts (dp_group) and gathered
        # around ExpertWeights.forward only. Their reduce-scatter sums over those
        # ranks and divides by the WHOLE world, as average_gradients does without
        # FSDP: the all-to-all backward already summed the expert-parallel group's
        # tokens into each expert's gradient (the torchtitan layout for MoE + FSDP2).
        from torch.distributed.device_mesh import DeviceMesh

        dp_mesh = DeviceMesh.from_group(ctx.dp_group, device_type)
        for layer in model.moe_layers:
            fully_shard(layer.experts, mesh=dp_mesh, mp_policy=low)
            layer.experts.set_gradient_divide_factor(float(ctx.world_size))
            # gloo has no PREMUL_SUM: sum, then scale. Not on a one-rank mesh, where
            # FSDP (torch 2.13) would divide twice: no collective runs there anyway.
            if device_type == "cpu" and dp_mesh.size() > 1:
                layer.experts.set_force_sum_reduction_for_comms(True)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=low)
    fully_shard(model, mesh=mesh, mp_policy=low)
    return model


def shard_model_experts(model: torch.nn.Module, ctx: DistContext) -> None:
    """Expert parallelism: each MoE layer keeps this rank's experts (in place)."""
    from trainer.model.expert_parallel import shard_experts_

    for layer in model.moe_layers:
        shard_experts_(layer, ctx.ep_rank, ctx.expert_parallel, ctx.ep_group)


def full_state_dict(model: torch.nn.Module, ctx: DistContext) -> dict[str, torch.Tensor]:
    """The model's whole state_dict on every rank (what the rollout engine loads).

    Under FSDP the shards are all-gathered, under expert parallelism the expert
    slices (a collective: every rank calls it); otherwise the module's own
    state_dict, no copy.
    """
    state = rank_state_dict(model, ctx)
    if ctx.ep:
        from trainer.model.expert_parallel import expert_shards, gather_expert_shards

        return gather_expert_shards(state, expert_shards(model))
    return state


def rank_state_dict(model: torch.nn.Module, ctx: DistContext) -> dict[str, torch.Tensor]:
    """The model's state_dict as this rank computes with it: under FSDP the shards
    all-gathered (a collective), under expert parallelism only this rank's experts."""
    if not ctx.fsdp:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def load_rank_state_dict(model: torch.nn.Module, state: dict, ctx: DistContext) -> None:
    """``rank_state_dict``'s inverse: whole tensors (this rank's experts under expert
    parallelism) into the model, under FSDP into this rank's shards."""
    if not ctx.fsdp:
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def local_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser's state_dict with every sharded (DTensor) state as this rank's
    plain local shard, for a per-rank checkpoint (FSDP with expert parallelism)."""
    state = optimizer.state_dict()
    return {
        "state": {
            index: {name: _local(value) for name, value in per_param.items()}
            for index, per_param in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }


def load_local_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``local_optimizer_state``'s inverse on the same world size: each local shard
    becomes a DTensor laid out like its parameter again."""
    from torch.distributed.tensor import DTensor

    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not isinstance(param, DTensor):
                continue
            per_param = optimizer.state.get(param, {})
            for name, value in per_param.items():
                if torch.is_tensor(value) and value.dim() > 0 and not isinstance(value, DTensor):
                    per_param[name] = DTensor.from_local(
                        value,
                        param.device_mesh,
                        param.placements,
                        shape=param.shape,
                        stride=param.stride(),
                        run_check=False,
                    )


def _local(value: Any) -> Any:
    return value.to_local() if hasattr(value, "to_local") else value
