"""Which metrics each page draws, in which sections (pure data, no Django).

A run page shows every key of its sections that the run's model has: the
MoE-only keys are left out for a dense model (model.n_experts == 0).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer import metric_keys as mk


@dataclass(frozen=True)
class Section:
    title: str
    keys: tuple[str, ...]


RUN_SECTIONS: tuple[Section, ...] = (
    Section("Reward and accuracy", (mk.REWARD_MEAN, mk.REWARD_ACCURACY, mk.EVAL_ACCURACY)),
    Section(
        "Training-inference mismatch",
        (
            mk.MISMATCH_KL_K1,
            mk.MISMATCH_KL_K3,
            mk.MISMATCH_EXTREME_TOKEN_FRAC,
            mk.MISMATCH_ROUTING_INCONSISTENCY,
        ),
    ),
    Section("Expert balance", (mk.EXPERTS_MAX_VIOLATION, mk.EXPERTS_ROUTER_ENTROPY)),
    Section("Router temperature", (mk.ROUTER_TEMPERATURE,)),
    Section("Gradients", (mk.POLICY_GRAD_NORM, mk.GRADS_COS_POLICY_AUX, mk.GRADS_SURGERY_FRAC)),
    Section("Clipping and importance sampling", (mk.POLICY_CLIP_FRAC, mk.TIS_CLIP_FRAC)),
)

# Keys a dense model never logs.
MOE_ONLY_KEYS: frozenset[str] = frozenset(
    {
        mk.MISMATCH_ROUTING_INCONSISTENCY,
        mk.EXPERTS_MAX_VIOLATION,
        mk.EXPERTS_ROUTER_ENTROPY,
        mk.ROUTER_TEMPERATURE,
        mk.GRADS_COS_POLICY_AUX,
        mk.GRADS_SURGERY_FRAC,
    }
)

ALL_RUN_KEYS: tuple[str, ...] = tuple(k for s in RUN_SECTIONS for k in s.keys)

# The experiment page: variants over seeds, the metrics a stability study reads first.
EXPERIMENT_KEYS: tuple[str, ...] = (
    mk.REWARD_ACCURACY,
    mk.EVAL_ACCURACY,
    mk.MISMATCH_KL_K3,
    mk.MISMATCH_EXTREME_TOKEN_FRAC,
    mk.MISMATCH_ROUTING_INCONSISTENCY,
    mk.EXPERTS_MAX_VIOLATION,
    mk.POLICY_GRAD_NORM,
)

# Keys a chart endpoint accepts: the metric-key alphabet of the platform's API.
METRIC_KEY_RE = re.compile(r"^[A-Za-z0-9_./-]{1,100}$")


def is_moe(config: Mapping[str, Any] | None) -> bool:
    return bool(((config or {}).get("model") or {}).get("n_experts"))


def moe_layers(config: Mapping[str, Any] | None) -> list[int]:
    """Layers that log an expert-load vector: every block of an MoE model."""
    if not is_moe(config):
        return []
    return list(range(int(config["model"].get("n_layers") or 0)))


def sections_for(
    config: Mapping[str, Any] | None, logged_keys: Sequence[str] | None = None
) -> list[Section]:
    """The run page's sections for this model; with ``logged_keys`` (the keys of the
    run's latest step) only keys the run actually logs. Empty sections are dropped."""
    moe = is_moe(config)
    logged = set(logged_keys) if logged_keys else None
    out = []
    for section in RUN_SECTIONS:
        keys = tuple(
            k
            for k in section.keys
            if (moe or k not in MOE_ONLY_KEYS) and (logged is None or k in logged)
        )
        if keys:
            out.append(Section(section.title, keys))
    return out


def keys_for_runs(configs: Sequence[Mapping[str, Any] | None]) -> list[str]:
    """Keys for a set of runs: MoE-only keys when any of them is an MoE model."""
    moe = any(is_moe(c) for c in configs)
    return [k for k in ALL_RUN_KEYS if moe or k not in MOE_ONLY_KEYS]


def chart_id(prefix: str, key: str) -> str:
    """An HTML id for a metric's chart: 'chart-mismatch-kl_k3'."""
    return f"{prefix}-" + re.sub(r"[^A-Za-z0-9_-]+", "-", key).strip("-")
