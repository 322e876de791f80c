"""The stability review table: one row per variant, aggregated over its seeds.

Columns (docs/design.md, "dashboards"): training-inference KL (mismatch/kl_k3,
mean over the run, shown in the registry's unit, ×1e-3; a run that logs no k3 shows
its k1, else its mean |log-prob difference|, else its mean |probability difference|,
labelled: the mismatch signal each framework logs, docs/integrations.md),
routing inconsistency %, extreme-token %,
collapse step (mean over seeds, ">= N" when any seed is censored, see
dashboard/charts/survival.py), final accuracy. Every number is first a per-run mean,
then a mean over the variant's seeds, so a seed with more logged steps does not
weigh more than another.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dashboard.charts.aggregate import Series
from dashboard.charts.downsample import as_float_array
from dashboard.charts.survival import CollapseSummary, RunOutcome, summarize_outcomes
from trainer import metric_keys as mk

# KL in the registry's display unit (×1e-3), as on the charts.
KL_SCALE = mk.metric_spec(mk.MISMATCH_KL_K3).scale
MISSING = "-"
# What the KL column shows, in order of preference, and the label a value of that kind
# carries in the cell (none for the k3 KL the column is named after).
MISMATCH_KINDS: tuple[tuple[str, str], ...] = (
    (mk.MISMATCH_KL_K3, ""),
    (mk.MISMATCH_KL_K1, "k1"),
    (mk.MISMATCH_LOGP_ABS_DIFF, "|Δlog p|"),
    (mk.MISMATCH_PROB_ABS_DIFF, "|Δp|"),
)
MISMATCH_LABELS = dict(MISMATCH_KINDS)

# (field of StabilityRow.as_dict(), column header)
STABILITY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("variant", "variant"),
    ("runs", "seeds"),
    ("kl_k3_x1e3", f"training-inference KL ({mk.metric_spec(mk.MISMATCH_KL_K3).unit})"),
    ("routing_inconsistency_pct", "routing inconsistency %"),
    ("extreme_token_pct", "extreme-token %"),
    ("collapse_step", "collapse step"),
    ("collapsed", "collapsed"),
    ("final_accuracy_pct", "final accuracy %"),
)


def series_mean(series: Series | None, until_step: int | None = None) -> float:
    """Mean of the finite values of a (steps, values) series, optionally up to a step."""
    if series is None:
        return math.nan
    x = np.asarray(series[0])
    y = as_float_array(series[1])
    keep = np.isfinite(y)
    if until_step is not None:
        keep &= x <= until_step
    return float(y[keep].mean()) if keep.any() else math.nan


def last_finite(series: Series | None) -> float:
    if series is None:
        return math.nan
    x = np.asarray(series[0])
    y = as_float_array(series[1])
    keep = np.flatnonzero(np.isfinite(y))
    return float(y[keep[np.argmax(x[keep])]]) if keep.size else math.nan


@dataclass(frozen=True)
class RunStats:
    """One run's contribution to the table. Shares are in [0, 1]; NaN = not measured
    (a dense model has no routing inconsistency)."""

    outcome: RunOutcome
    kl_k3: float  # the mismatch the KL column shows: of kind ``kl_kind``
    routing_inconsistency: float
    extreme_token_frac: float
    final_accuracy: float
    kl_kind: str = mk.MISMATCH_KL_K3

    @classmethod
    def from_series(
        cls,
        outcome: RunOutcome,
        series: Mapping[str, Series],
        *,
        final_accuracy: float | None = None,
        until_collapse: bool = False,
    ) -> RunStats:
        """Per-run means from metric series keyed by metric key.

        final_accuracy: the summary's value when known, else the last held-out
        accuracy logged. until_collapse: average only up to the collapse step,
        to read the mismatch while the run was healthy.
        """
        until = outcome.step if (until_collapse and outcome.collapsed) else None
        accuracy = (
            float(final_accuracy)
            if final_accuracy is not None
            else last_finite(series.get(mk.EVAL_ACCURACY))
        )
        kind, mismatch = mk.MISMATCH_KL_K3, math.nan
        for key, _ in MISMATCH_KINDS:
            mismatch = series_mean(series.get(key), until)
            if math.isfinite(mismatch):
                kind = key
                break
        return cls(
            outcome=outcome,
            kl_k3=mismatch,
            kl_kind=kind,
            routing_inconsistency=series_mean(series.get(mk.MISMATCH_ROUTING_INCONSISTENCY), until),
            extreme_token_frac=series_mean(series.get(mk.MISMATCH_EXTREME_TOKEN_FRAC), until),
            final_accuracy=accuracy,
        )


def _mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample std (ddof=1; 0 for one value) of the finite values; NaN if none."""
    arr = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return math.nan, math.nan
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return float(arr.mean()), std


def _fmt(mean: float, std: float | None = None, digits: int = 2, suffix: str = "") -> str:
    if not math.isfinite(mean):
        return MISSING
    text = f"{mean:.{digits}f}"
    if std is not None and math.isfinite(std) and std > 0:
        text += f" ± {std:.{digits}f}"
    return text + suffix


def kl_kind_of(seeds: Iterable[RunStats]) -> str:
    """The mismatch a variant's KL cell shows: the most preferred kind any seed has
    (the seeds of another kind are left out of the mean)."""
    present = {r.kl_kind for r in seeds if math.isfinite(r.kl_k3)}
    return next((key for key, _ in MISMATCH_KINDS if key in present), mk.MISMATCH_KL_K3)


def _labelled(text: str, kind: str) -> str:
    label = MISMATCH_LABELS.get(kind, "")
    return f"{text} ({label})" if label and text != MISSING else text


def _none_if_nan(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class StabilityRow:
    """A variant's row; numbers already scaled for display (KL ×1e-3, shares in %)."""

    variant: str
    runs: int
    kl_k3_x1e3: float
    kl_k3_x1e3_std: float
    routing_inconsistency_pct: float
    extreme_token_pct: float
    collapse: CollapseSummary
    final_accuracy_pct: float
    final_accuracy_pct_std: float
    seeds: list[RunStats] = field(default_factory=list, repr=False, compare=False)
    kl_kind: str = mk.MISMATCH_KL_K3

    def cells(self) -> dict[str, str]:
        """Display strings keyed like STABILITY_COLUMNS."""
        return {
            "variant": self.variant,
            "runs": str(self.runs),
            "kl_k3_x1e3": _labelled(_fmt(self.kl_k3_x1e3, self.kl_k3_x1e3_std), self.kl_kind),
            "routing_inconsistency_pct": _fmt(self.routing_inconsistency_pct, suffix="%"),
            "extreme_token_pct": _fmt(self.extreme_token_pct, suffix="%"),
            "collapse_step": self.collapse.label,
            "collapsed": f"{self.collapse.collapsed}/{self.collapse.runs}",
            "final_accuracy_pct": _fmt(
                self.final_accuracy_pct, self.final_accuracy_pct_std, digits=1, suffix="%"
            ),
        }

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready numbers (None where not measured) plus the collapse label."""
        return {
            "variant": self.variant,
            "runs": self.runs,
            "kl_k3_x1e3": _none_if_nan(self.kl_k3_x1e3),
            "kl_k3_x1e3_std": _none_if_nan(self.kl_k3_x1e3_std),
            "kl_kind": self.kl_kind,
            "routing_inconsistency_pct": _none_if_nan(self.routing_inconsistency_pct),
            "extreme_token_pct": _none_if_nan(self.extreme_token_pct),
            "collapse_step": self.collapse.label,
            "collapse_step_mean": self.collapse.mean_step,
            "collapse_step_is_lower_bound": self.collapse.lower_bound,
            "collapsed": self.collapse.collapsed,
            "final_accuracy_pct": _none_if_nan(self.final_accuracy_pct),
            "final_accuracy_pct_std": _none_if_nan(self.final_accuracy_pct_std),
        }


def stability_table_rows(runs: Iterable[RunStats]) -> list[StabilityRow]:
    """One row per variant, in the order variants first appear in ``runs``."""
    by_variant: dict[str, list[RunStats]] = {}
    for run in runs:
        by_variant.setdefault(run.outcome.variant, []).append(run)
    rows = []
    for variant, seeds in by_variant.items():
        kind = kl_kind_of(seeds)
        kl, kl_std = _mean_std(r.kl_k3 * KL_SCALE for r in seeds if r.kl_kind == kind)
        routing, _ = _mean_std(r.routing_inconsistency * 100 for r in seeds)
        extreme, _ = _mean_std(r.extreme_token_frac * 100 for r in seeds)
        accuracy, accuracy_std = _mean_std(r.final_accuracy * 100 for r in seeds)
        rows.append(
            StabilityRow(
                variant=variant,
                runs=len(seeds),
                kl_k3_x1e3=kl,
                kl_k3_x1e3_std=kl_std,
                routing_inconsistency_pct=routing,
                extreme_token_pct=extreme,
                collapse=summarize_outcomes(variant, [r.outcome for r in seeds]),
                final_accuracy_pct=accuracy,
                final_accuracy_pct_std=accuracy_std,
                seeds=seeds,
                kl_kind=kind,
            )
        )
    return rows
