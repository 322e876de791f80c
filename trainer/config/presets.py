"""Named presets: partial configs layered over the schema defaults.

A preset is data, never a code path: ``preset_dict(name)`` returns a plain
dict that ``trainer.validation.validate_config`` accepts, and ``--set`` overrides
go on top of it. Tiny presets run on a 2-core CPU; ``gpu-*`` presets are the
seeds' GPU scale (12-layer dense, MoE-16, MoE-32).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.config import ExperimentConfig, deep_merge
from trainer.errors import FieldError


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    overrides: dict[str, Any] = field(default_factory=dict)
    base: str | None = None


# Tiny CPU scale: 2 layers, width 128, 8 experts top-2 (expert width 256 -> 512 active).
_TINY_MOE = {
    "model": {
        "n_layers": 2,
        "d_model": 128,
        "n_heads": 4,
        "n_experts": 8,
        "top_k": 2,
        "expert_hidden": 256,
        "max_seq_len": 64,
    },
    "task": {"name": "arithmetic", "operations": ["add"], "min_digits": 1, "max_digits": 2},
    "rollout": {"precision": "bf16", "prompts_per_step": 8, "group_size": 8, "max_new_tokens": 8},
    "algorithm": {"name": "grpo", "minibatches": 4},
    "optim": {"lr": 1e-4, "lr_min": 3e-5, "warmup_steps": 5},
    "run": {"steps": 50},
}

# GPU scale from the seeds: 12 layers, width 768; MoE-16 / MoE-32 with top-2.
_GPU_BASE = {
    "model": {
        "n_layers": 12,
        "d_model": 768,
        "n_heads": 12,
        "expert_hidden": 1536,
        "max_seq_len": 256,
    },
    "task": {
        "name": "arithmetic",
        "operations": ["add", "sub", "mul"],
        "min_digits": 2,
        "max_digits": 4,
        "scratchpad": True,
    },
    "warm_start": {"batch_size": 256, "lr": 1e-3, "max_steps": 20000},
    "rollout": {
        "precision": "bf16",
        "prompts_per_step": 64,
        "group_size": 16,
        "max_new_tokens": 96,
    },
    "algorithm": {"name": "grpo", "minibatches": 8},
    "optim": {
        "lr": 1e-5,
        "lr_min": 3e-6,
        "warmup_steps": 20,
        "entropy_coef_start": 0.01,
        "entropy_coef_end": 0.001,
        # bf16 weights in the forward and backward, fp32 masters and Adam moments
        # (trainer/devices/precision.py): the sync-free grouped GEMM on CUDA is bf16
        # (docs/gpu.md, "What runs where"), and bf16 halves the weight traffic.
        "param_dtype": "bf16",
    },
    "run": {"steps": 500, "device": "auto"},
}

_PRESETS: list[Preset] = [
    Preset("moe-grpo", "Tiny MoE (2 layers, 8 experts top-2), GRPO, bf16 rollouts.", _TINY_MOE),
    Preset(
        "dense-grpo",
        "Tiny dense model with the MoE preset's active parameters, GRPO.",
        {"model": {"n_experts": 0}},
        base="moe-grpo",
    ),
    Preset(
        "moe16-grpo",
        "Tiny MoE with 16 experts top-2, GRPO.",
        {"model": {"n_experts": 16, "expert_hidden": 128}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-r3",
        "Tiny MoE GRPO with Rollout Routing Replay (R3).",
        {"stabilizers": {"replay": {"mode": "r3"}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-r3-warmup",
        "Tiny MoE GRPO with R3; over the first 20 steps a share of (token, layer) pairs "
        "(10% at step 0, shrinking linearly to 0) keeps the training router's own choice.",
        {
            "stabilizers": {
                "replay": {"mode": "r3", "warmup_steps": 20, "warmup_keep_frac": 0.1},
            }
        },
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-r3-rle",
        "Tiny MoE GRPO with R3, routing shipped run-length encoded (storage comparison).",
        {"stabilizers": {"replay": {"mode": "r3", "compression": "rle"}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-r2",
        "Tiny MoE GRPO replaying the old policy's routing (R2).",
        {"stabilizers": {"replay": {"mode": "r2"}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-gspo",
        "Tiny MoE, GSPO (sequence-level ratio, clip 3e-4/4e-4).",
        {"algorithm": {"name": "gspo"}},
        base="moe-grpo",
    ),
    Preset(
        "moe-gspo-r3",
        "Tiny MoE, GSPO with R3.",
        {"algorithm": {"name": "gspo"}, "stabilizers": {"replay": {"mode": "r3"}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-ppo",
        "Tiny MoE, PPO with a value head and GAE.",
        {"algorithm": {"name": "ppo"}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-tis",
        "Tiny MoE GRPO with truncated importance sampling (C=2).",
        {"stabilizers": {"is_correction": {"kind": "tis"}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-mis",
        "Tiny MoE GRPO masking sequences whose geometric-mean ratio leaves [0.5, 2] (MIS).",
        {"stabilizers": {"is_correction": {"kind": "mis"}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-icepop",
        "Tiny MoE GRPO with IcePop: tokens with ratio outside [0.5, 5] get zero weight.",
        {"stabilizers": {"is_correction": {"kind": "icepop"}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-auxloss",
        "Tiny MoE GRPO with the Switch load-balancing loss (alpha 0.01, whole batch).",
        {"stabilizers": {"balance": {"aux_loss_coef": 0.01}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-auxloss-seq",
        "Tiny MoE GRPO with the per-sequence Switch load-balancing loss (alpha 0.01).",
        {"stabilizers": {"balance": {"aux_loss_coef": 0.01, "aux_loss_scope": "sequence"}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-zloss",
        "Tiny MoE GRPO with the ST-MoE router z-loss (1e-3).",
        {"stabilizers": {"balance": {"z_loss_coef": 1e-3}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-auxfree",
        "Tiny MoE GRPO with DeepSeek-V3 auxiliary-loss-free balancing (selection bias, u=1e-3).",
        {"stabilizers": {"balance": {"aux_free_bias": True, "aux_free_bias_rate": 1e-3}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-router-kl",
        "Tiny MoE GRPO with the router-anchoring KL to the last 4 steps' routing (0.1).",
        {"stabilizers": {"balance": {"router_kl_coef": 0.1, "router_kl_buffer_steps": 4}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-lb",
        "Tiny MoE GRPO with aux + z loss, no surgery (the control for moe-grpo-lb-surgery).",
        {"stabilizers": {"balance": {"aux_loss_coef": 0.01, "z_loss_coef": 1e-3}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-lb-surgery",
        "Tiny MoE GRPO with aux + z loss and PCGrad surgery against the policy gradient.",
        {
            "stabilizers": {
                "balance": {"aux_loss_coef": 0.01, "z_loss_coef": 1e-3},
                "surgery": {"enabled": True},
            }
        },
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-lb-surgery-all",
        "As moe-grpo-lb-surgery, with surgery on every parameter the losses share.",
        {"stabilizers": {"surgery": {"scope": "all"}}},
        base="moe-grpo-lb-surgery",
    ),
    Preset(
        "moe-grpo-temperature",
        "Tiny MoE GRPO with the router temperature controller, checking every 10 steps "
        "(the default 1000 scaled to a 50-step run).",
        {"stabilizers": {"router_temperature": {"enabled": True, "interval": 10}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-noisy",
        "Tiny MoE GRPO with noisy top-k gating (learned softplus scale, training only).",
        {"stabilizers": {"noisy_gating": {"enabled": True}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-noisy-temperature",
        "Noisy gating with the temperature controller: the one setting where the "
        "temperature changes selection.",
        {
            "stabilizers": {
                "noisy_gating": {"enabled": True},
                "router_temperature": {"enabled": True, "interval": 10},
            }
        },
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-expert-clip",
        "Tiny MoE GRPO clipping each expert's gradient norm to 1 before the global clip.",
        {"optim": {"per_expert_grad_clip": 1.0}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-router-lr",
        "Tiny MoE GRPO with the router learning rate scaled by 0.1 (experts unchanged).",
        {"optim": {"router_lr_scale": 0.1}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-ema-adv",
        "Tiny MoE GRPO with EMA-smoothed reward normalisation (decay 0.99) before grouping.",
        {"algorithm": {"advantage": {"ema_decay": 0.99}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-expert-zscore",
        "Tiny MoE GRPO with advantages z-scored within groups sharing the dominant expert "
        "of MoE layer 0.",
        {"algorithm": {"advantage": {"expert_zscore": True, "expert_zscore_layer": 0}}},
        base="moe-grpo",
    ),
    Preset(
        "moe-grpo-scratchpad",
        "Tiny MoE GRPO on 2-3 digit addition with a scratchpad (20+ token responses).",
        {
            "model": {"max_seq_len": 96},
            "task": {"min_digits": 2, "max_digits": 3, "scratchpad": True},
            "rollout": {"max_new_tokens": 40},
        },
        base="moe-grpo",
    ),
    Preset(
        "sort-moe-grpo",
        "Tiny MoE GRPO on sorting lists of numbers.",
        {"model": {"max_seq_len": 96}, "task": {"name": "sort"}, "rollout": {"max_new_tokens": 32}},
        base="moe-grpo",
    ),
    Preset(
        "text-grpo",
        "Tiny MoE GRPO on the shipped word problems (GSM8K format, numeric verifier); "
        "UTF-8 bytes on the builtin model, the checkpoint's tokenizer with model.source.",
        {
            "model": {"max_seq_len": 128},
            "task": {"name": "text", "data_file": "word_problems.jsonl", "verifier": "numeric"},
            "rollout": {"max_new_tokens": 32},
        },
        base="moe-grpo",
    ),
    Preset(
        "gpu-dense-grpo",
        "GPU scale: 12-layer dense transformer, GRPO.",
        deep_merge(_GPU_BASE, {"model": {"n_experts": 0, "dense_hidden": 3072}}),
    ),
    Preset(
        "gpu-moe16-grpo",
        "GPU scale: 12-layer MoE-16 top-2, GRPO.",
        deep_merge(_GPU_BASE, {"model": {"n_experts": 16, "top_k": 2}}),
    ),
    Preset(
        "gpu-moe32-grpo",
        "GPU scale: 12-layer MoE-32 top-2, GRPO.",
        deep_merge(_GPU_BASE, {"model": {"n_experts": 32, "top_k": 2, "expert_hidden": 768}}),
    ),
    Preset(
        "gpu-moe16-grpo-r3",
        "GPU scale: MoE-16 GRPO with R3.",
        {"stabilizers": {"replay": {"mode": "r3"}}},
        base="gpu-moe16-grpo",
    ),
]

PRESETS: dict[str, Preset] = {p.name: p for p in _PRESETS}


def preset_dict(name: str) -> dict[str, Any]:
    """The preset's partial config as a nested dict (bases applied)."""
    if name not in PRESETS:
        known = ", ".join(sorted(PRESETS))
        raise FieldError([("preset", f"unknown preset '{name}'; choose one of: {known}")])
    preset = PRESETS[name]
    base = preset_dict(preset.base) if preset.base else {}
    kind = preset.overrides.get("task", {}).get("name")
    if kind is not None and kind != base.get("task", {}).get("name"):
        # Another task kind has other fields: its section starts afresh.
        base.pop("task", None)
    return deep_merge(base, preset.overrides)


def resolve_preset(name: str) -> ExperimentConfig:
    """The preset as a config, checked against the schema. The schema package
    imports no task, so the task-dependent length check is not run here: every
    preset passes it (tests/trainer/test_tasks.py), and a config built from a
    preset plus overrides goes through ``trainer.validation.validate_config``."""
    return ExperimentConfig.model_validate(preset_dict(name))


def list_presets() -> list[tuple[str, str]]:
    return [(p.name, p.description) for p in _PRESETS]
