"""A run's summary.json (docs/design.md, "run folder"): how the run ended, what it learned
(held-out accuracy through the rollout engine and without its gap), its dose (what it
was set to and the routing gap it measured), the device it used and the machine."""

from __future__ import annotations

from typing import Any

from trainer.analysis.collapse import CollapseDetector
from trainer.analysis.run_record import mean_gap
from trainer.config import ExperimentConfig
from trainer.devices.environment import environment_record
from trainer.devices.mps import mps_active
from trainer.devices.packing import memory_share
from trainer.rollout.numerics import Numerics
from trainer.run.context import RunState, resolve_device
from trainer.run.device_record import device_record


def run_summary(
    cfg: ExperimentConfig, state: RunState, collapse: CollapseDetector, status: str, wall: float
) -> dict[str, Any]:
    """summary.json: the outcome (status, collapse, held-out accuracy through the engine and
    without its gap), the dose, the device and the machine."""
    evals = [acc for _, acc in state.eval_history]
    clean = [acc for _, acc in state.clean_eval_history]
    device = resolve_device(cfg.run.device)
    return {
        "status": status,
        "collapsed": collapse.collapsed,
        "collapse_step": collapse.collapse_step,
        "collapse_reason": collapse.collapse_reason,
        "collapse_revoked": [list(r) for r in collapse.revoked],  # dips that recovered
        "initial_accuracy": state.initial_accuracy,
        "final_accuracy": evals[-1] if evals else None,
        "best_accuracy": max(evals) if evals else None,
        # The learning endpoint: held-out accuracy decoded without the engine's gap
        # (the fields above: through the rollout engine, its gap included).
        "initial_accuracy_clean": state.initial_accuracy_clean,
        "final_accuracy_clean": clean[-1] if clean else None,
        "best_accuracy_clean": max(clean) if clean else None,
        "final_batch_accuracy": state.accuracy_history[-1] if state.accuracy_history else None,
        "steps": state.step,
        "total_steps": cfg.run.steps,
        "wall_time_s": round(wall, 3),
        "dose": dose_record(cfg, state),
        # Device, capability, numerics mode and MoE backends the run used (docs/gpu.md).
        "device": {
            **device_record(cfg, device, Numerics(cfg.rollout.precision, device).dtype),
            # a packed slot's share of its GPU's memory (None: the whole device)
            "memory_share": memory_share() if device.type == "cuda" else None,
            # a client of the study's MPS daemon (trainer.devices.mps), None off CUDA
            "mps": mps_active() if device.type == "cuda" else None,
        },
        # The machine: CPU model and capability, torch and BLAS build, GPUs (a CPU
        # run's bits depend on them; trainer/devices/environment.py).
        "environment": environment_record(),
    }


def dose_record(cfg: ExperimentConfig, state: RunState) -> dict[str, Any]:
    """The run's training-inference gap: what it was set to (router noise sigma, kind,
    whose seed drew the projections, the rollout precision) and what it measured,
    the routing gap over its first steps (the covariate of the causal analysis,
    trainer.analysis.survival.run_gap; None for a dense model)."""
    from trainer.rollout.router_noise import noise_seed

    ro = cfg.rollout
    noisy = cfg.model.is_moe and ro.router_noise > 0
    return {
        "rollout_precision": ro.precision,
        "router_noise": ro.router_noise if cfg.model.is_moe else 0.0,
        "router_noise_kind": ro.router_noise_kind if noisy else None,
        "router_noise_draw": ro.router_noise_draw if noisy else None,
        "projection_seed": noise_seed(cfg) if noisy and ro.router_noise_kind == "fixed" else None,
        "routing_gap": mean_gap(state.gap_history) if cfg.model.is_moe else None,
        "routing_gap_steps": len(state.gap_history),
    }
