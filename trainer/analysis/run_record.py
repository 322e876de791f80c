"""One finished run as the statistics read it: the typed record shared by the
survival models (``trainer.analysis.survival``), the causal report
(``trainer.analysis.causal_report``, built from run folders) and the stability
review's causal panel (``dashboard.review.queries.run_records``, built from the
platform's stored runs).

A run's time is its collapse step, or its last step when it never collapsed
(censored: docs/design.md 3.6); its routing gap is the mean routing
inconsistency over its first ``GAP_STEPS`` steps (0 for a dense model).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer import metric_keys as K
from trainer.config import ExperimentConfig

GAP_STEPS = 10  # the gap is measured over a run's first steps


def mean_gap(values: Iterable[float]) -> float:
    """A run's routing gap from the routing inconsistency of its first steps (at most
    GAP_STEPS of them): their mean; 0 without any (a dense model has no routing)."""
    values = list(values)[:GAP_STEPS]
    return float(np.mean(values)) if values else 0.0


def run_gap(rows: Sequence[Mapping[str, Any]]) -> float:
    """Mean natural routing inconsistency over the first GAP_STEPS steps (0 without routing)."""
    return mean_gap(
        r[K.MISMATCH_ROUTING_INCONSISTENCY]
        for r in rows[:GAP_STEPS]
        if r.get(K.MISMATCH_ROUTING_INCONSISTENCY) is not None
    )


@dataclass(frozen=True)
class RunRecord:
    """variant, seed: the cell and the run's seed; base: the warm-start seed (runs
    of one base share a starting model: a cluster); moe, r3: an MoE model, routing
    replay R3; sigma, precision: the rollout's router noise and precision; gap:
    the routing gap (a share, 0..1); collapsed, collapse_step, steps: the
    (re-judged) outcome. ``rows`` (metrics.jsonl) and ``summary`` (summary.json)
    travel along where the record was read from a run folder."""

    variant: str
    seed: int
    base: int
    moe: bool
    r3: bool
    gap: float
    collapsed: bool
    collapse_step: int | None
    steps: int
    sigma: float = 0.0
    precision: str = "fp32"
    rows: Sequence[Mapping[str, Any]] = field(default=(), repr=False, compare=False)
    summary: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def time(self) -> int:
        """The collapse step, or the last step of a run that never collapsed (censored)."""
        return int(self.collapse_step) if self.collapsed else int(self.steps)

    @property
    def event(self) -> int:
        return int(self.collapsed)

    @property
    def environment(self) -> Any:
        """The machine the run trained on (summary.json ``environment``), or None."""
        return self.summary.get("environment")

    @classmethod
    def of(
        cls,
        cfg: ExperimentConfig,
        summary: Mapping[str, Any],
        *,
        variant: str,
        base: int | None = None,
        gap: float | None = None,
        rows: Sequence[Mapping[str, Any]] = (),
    ) -> RunRecord:
        """The record of a run with this config and summary; ``gap`` measured
        elsewhere, or from ``rows``; ``base`` defaults to ``warm_start.seed``."""
        collapsed = bool(summary.get("collapsed"))
        return cls(
            variant=variant,
            seed=cfg.run.seed,
            base=cfg.warm_start.seed if base is None else base,
            moe=cfg.model.is_moe,
            r3=cfg.stabilizers.replay.mode == "r3",
            gap=run_gap(rows) if gap is None else float(gap),
            collapsed=collapsed,
            collapse_step=summary.get("collapse_step") if collapsed else None,
            steps=int(summary["steps"]),
            sigma=float(cfg.rollout.router_noise),
            precision=cfg.rollout.precision,
            rows=rows,
            summary=summary,
        )
