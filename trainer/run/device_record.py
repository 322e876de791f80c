"""What summary.json says about how a run used its device.

It reports the choices of the parts above the device layer (the MoE backend of
the training forward, ``trainer.model.dispatch``; the rollout engine's decode
and fp8 plan, ``trainer.rollout``), so it lives with the run, not in
``trainer.devices``, which knows only what a device can do.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.config import ExperimentConfig
from trainer.devices.capability import capability_label, device_capability, has_fp8_gemm
from trainer.devices.dtypes import DTYPES
from trainer.model.dispatch import choose_backend
from trainer.model.moe_fused import choose_moe_layer
from trainer.rollout.fp8 import choose_fp8_plan
from trainer.rollout.static_decode import choose_decode, compiled_moe_backend


def device_record(cfg: ExperimentConfig, device: torch.device, engine_dtype: torch.dtype):
    """What summary.json says about how the run used its device: the device and its
    capability, the numerics mode, the MoE backend of the training forward and of
    the rollout engine (trainer.model.dispatch.choose_backend: never a silent loop),
    and for fp8 rollouts which GEMMs run real e4m3 kernels and which are emulated
    (trainer.rollout.fp8.choose_fp8_plan, the engine's own choice)."""
    capability = device_capability(device)
    record: dict[str, Any] = {
        "device": str(device),
        "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "capability": capability_label(capability),
        "deterministic": cfg.run.deterministic,
        "tf32": cfg.run.tf32,
        "timings": "synchronised at phase boundaries" if device.type == "cuda" else "eager",
        # the decode step: eager, or compiled (a CUDA graph on CUDA; trainer.rollout.static_decode)
        "decode": decode_choice(cfg, device)[0],
        "decode_reason": decode_choice(cfg, device)[1],
    }
    if cfg.model.n_experts:
        train_dtype = DTYPES[cfg.optim.param_dtype]
        requested = "auto"
        if decode_choice(cfg, device)[0] == "compiled":  # the engine's own choice
            requested = compiled_moe_backend(requested, engine_dtype)
        rollout = choose_backend(requested, device.type, engine_dtype, capability)
        record["moe_backend"] = {
            "train": choose_backend("auto", device.type, train_dtype, capability),
            "rollout": rollout,
        }
        # the training forward's routed experts (trainer.model.moe_fused): fused or
        # reference; expert biases, another activation or expert parallelism: reference
        plain = cfg.model.expert_ffn == type(cfg.model.expert_ffn)()  # the SwiGLU experts
        fusable = plain and cfg.parallel.expert_parallel <= 1
        record["moe_layer"] = (
            choose_moe_layer(cfg.run.moe_layer, device.type) if fusable else "reference"
        )
    if cfg.rollout.precision == "fp8":
        # The engine's plan, from the same capability: "native",
        # "native-dense+emulated-experts" or "emulated", and per GEMM group.
        moe = bool(cfg.model.n_experts)
        plan = choose_fp8_plan(device.type, capability)
        record["fp8_rollout"] = plan.label(moe)
        record["fp8_gemms"] = plan.gemms(moe)
        record["fp8_gemm_available"] = has_fp8_gemm(capability)
        if moe:  # what the routed experts run on instead of engine_dtype's backend
            record["moe_backend"]["rollout"] = (
                "scaled_grouped_mm"
                if plan.experts == "native"
                # emulated experts: fp32 GEMMs on e4m3-rounded rows, whatever the storage
                else choose_backend("auto", device.type, torch.float32, capability)
            )
    return record


def decode_choice(cfg: ExperimentConfig, device: torch.device) -> tuple[str, str]:
    """The run's decode step (``rollout.decode``, ``auto`` resolved) and why."""
    return choose_decode(
        cfg.rollout.decode,
        device.type,
        cfg.run.steps * cfg.rollout.max_new_tokens,
        cfg.rollout.precision,
        cfg.rollout.kv_cache,
        cfg.parallel.expert_parallel,
    )
