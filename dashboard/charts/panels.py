"""Which metrics each page draws, in which sections (pure data, no Django).

Everything here is read from the one metric registry, ``trainer.metric_keys``
``METRIC_SPECS``, at call time: a spec's ``section`` puts it on the run page,
``experiment_page`` on the experiment page, ``moe_only`` leaves it out for a
dense model (model.n_experts == 0).
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


def run_sections() -> list[Section]:
    """Every run page section with its keys, in page order: the registry's named
    sections first, then any section only a newer spec names."""
    titles = list(mk.RUN_PAGE_SECTIONS)
    for spec in mk.METRIC_SPECS.values():
        if spec.section is not None and spec.section not in titles:
            titles.append(spec.section)
    keys_by_title: dict[str, list[str]] = {title: [] for title in titles}
    for spec in mk.METRIC_SPECS.values():
        if spec.section is not None:
            keys_by_title[spec.section].append(spec.key)
    return [Section(title, tuple(keys)) for title, keys in keys_by_title.items() if keys]


def moe_only_keys() -> frozenset[str]:
    """Keys a dense model never logs."""
    return frozenset(spec.key for spec in mk.METRIC_SPECS.values() if spec.moe_only)


def experiment_keys(moe: bool) -> list[str]:
    """The experiment page's charts (variants over seeds): the metrics a stability
    study reads first; the MoE-only ones when any of its runs is an MoE model."""
    return [
        spec.key
        for spec in mk.METRIC_SPECS.values()
        if spec.experiment_page and (moe or not spec.moe_only)
    ]


# Keys a chart endpoint accepts: the metric store's (trainer/metric_keys.py METRIC_NAME).
METRIC_KEY_RE = re.compile(rf"^{mk.METRIC_NAME.pattern}$")


def is_moe(config: Mapping[str, Any] | None) -> bool:
    return bool(((config or {}).get("model") or {}).get("n_experts"))


def moe_layers(config: Mapping[str, Any] | None) -> list[int]:
    """Layers that log an expert-load vector: every block of an MoE model but its
    dense ones (``model.dense_layers``, e.g. Qwen's mlp_only_layers)."""
    if not is_moe(config):
        return []
    dense = set(config["model"].get("dense_layers") or [])
    return [i for i in range(int(config["model"].get("n_layers") or 0)) if i not in dense]


def sections_for(
    config: Mapping[str, Any] | None, logged_keys: Sequence[str] | None = None
) -> list[Section]:
    """The run page's sections for this model; with ``logged_keys`` (the keys of the
    run's latest step) only keys the run actually logs. Empty sections are dropped."""
    moe = is_moe(config)
    moe_only = moe_only_keys()
    logged = set(logged_keys) if logged_keys else None
    out = []
    for section in run_sections():
        keys = tuple(
            k
            for k in section.keys
            if (moe or k not in moe_only) and (logged is None or k in logged)
        )
        if keys:
            out.append(Section(section.title, keys))
    return out


def keys_for_runs(configs: Sequence[Mapping[str, Any] | None]) -> list[str]:
    """Keys for a set of runs: MoE-only keys when any of them is an MoE model."""
    moe = any(is_moe(c) for c in configs)
    moe_only = moe_only_keys()
    return [k for s in run_sections() for k in s.keys if moe or k not in moe_only]


def chart_id(prefix: str, key: str) -> str:
    """An HTML id for a metric's chart: 'chart-mismatch-kl_k3'."""
    return f"{prefix}-" + re.sub(r"[^A-Za-z0-9_-]+", "-", key).strip("-")
