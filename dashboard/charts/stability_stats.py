"""The stability review's statistics: log-rank tests, median time-to-collapse with its
confidence interval, BCa intervals, and the dose-response layout of a sweep.

The formulas live in ``trainer/analysis/kaplan_meier.py`` (one place, hand-checked
tests); this module only arranges a review's variants for them. The reference
arm of the log-rank tests is ``moe-grpo`` when the review has it (the studies'
baseline), else its first variant. A dose-response appears when variant names
read ``<arm>-<level>`` with at least two rollout precisions among
``DOSE_LEVELS`` (the dose study's naming, trainer/studies/dose.json).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dashboard.charts.stability import KL_SCALE, StabilityRow
from trainer import metric_keys as mk
from trainer.analysis.intervals import mean_interval
from trainer.analysis.kaplan_meier import log_rank, median_survival

REFERENCE_VARIANT = "moe-grpo"
DOSE_LEVELS = ("fp32", "fp16", "bf16", "fp8")  # rollout precision, no gap -> largest gap
MISSING = "-"
KL_BOUNDS = mk.metric_spec(mk.MISMATCH_KL_K3).bounds  # k3 >= 0


@dataclass(frozen=True)
class SurvivalRow:
    variant: str
    collapsed: str
    median: str
    logrank_p: str
    kl_ci: str

    def as_dict(self) -> dict[str, str]:
        return self.__dict__.copy()


def _times_events(row: StabilityRow) -> tuple[list[int], list[bool]]:
    return [s.outcome.step for s in row.seeds], [s.outcome.collapsed for s in row.seeds]


def reference_of(rows: Sequence[StabilityRow], chosen: str | None = None) -> str | None:
    """The variant the log-rank tests compare against, whatever order the runs were
    picked in: the one the user chose, else ``moe-grpo``, else the no-gap arm of a
    dose axis (``...-fp32``), else the first variant by name."""
    names = sorted(r.variant for r in rows)
    if not names:
        return None
    if chosen in names:
        return chosen
    if REFERENCE_VARIANT in names:
        return REFERENCE_VARIANT
    dosed = [
        (DOSE_LEVELS.index(parts[1]), name)
        for name in names
        if (parts := split_dose_name(name)) is not None
    ]
    return min(dosed)[1] if dosed else names[0]


def _median_label(times: list[int], events: list[bool]) -> str:
    ci = median_survival(times, events)
    if ci.median is None:
        return f"not reached (>= {max(times)})" if times else MISSING
    low = MISSING if ci.low is None else str(ci.low)
    high = "open" if ci.high is None else str(ci.high)
    return f"{ci.median} [{low}, {high}]"


def _ci_label(
    values: list[float], scale: float, digits: int, bounds: tuple[float | None, float | None]
) -> str:
    """ "mean [low, high] (method, n)": the interval says what it rests on; with one
    seed there is none; it never reaches past the quantity's bounds."""
    ci = mean_interval([v * scale for v in values if math.isfinite(v)], bounds=bounds)
    if ci is None:
        return MISSING
    if ci.method == "none":
        return f"{ci.mean:.{digits}f} (1 seed: no interval)"
    return f"{ci.mean:.{digits}f} [{ci.low:.{digits}f}, {ci.high:.{digits}f}] ({ci.method}, n = {ci.n})"


def survival_rows(rows: Sequence[StabilityRow], chosen: str | None = None) -> list[SurvivalRow]:
    """Per variant: collapsed/seeds, median [95% CI], log-rank p vs the reference
    (``reference_of(rows, chosen)``), KL CI."""
    reference = reference_of(rows, chosen)
    ref = next((r for r in rows if r.variant == reference), None)
    ref_t, ref_e = _times_events(ref) if ref is not None else ([], [])
    out = []
    for row in rows:
        times, events = _times_events(row)
        p = MISSING
        if row.variant != reference and ref_t:
            test = log_rank(times, events, ref_t, ref_e)
            p = MISSING if test.p_value is None else f"{test.p_value:.3g}"
        out.append(
            SurvivalRow(
                variant=row.variant,
                collapsed=f"{sum(events)}/{len(events)}",
                median=_median_label(times, events),
                logrank_p=p,
                kl_ci=_ci_label(
                    [s.kl_k3 for s in row.seeds if s.kl_kind == row.kl_kind],
                    KL_SCALE,
                    3,
                    KL_BOUNDS,
                ),
            )
        )
    return out


def split_dose_name(variant: str) -> tuple[str, str] | None:
    """``moe-grpo-r3-fp8`` -> (``moe-grpo-r3``, ``fp8``); None when no dose level ends it."""
    arm, _, level = variant.rpartition("-")
    return (arm, level) if arm and level in DOSE_LEVELS else None


def dose_layout(variants: Sequence[str]) -> dict[str, Any] | None:
    """{"levels": [...], "arms": {arm: {level: variant}}} or None without a dose axis."""
    arms: dict[str, dict[str, str]] = {}
    levels = set()
    for variant in variants:
        parts = split_dose_name(variant)
        if parts is None:
            continue
        arms.setdefault(parts[0], {})[parts[1]] = variant
        levels.add(parts[1])
    if len(levels) < 2:
        return None
    return {"levels": [lv for lv in DOSE_LEVELS if lv in levels], "arms": arms}
