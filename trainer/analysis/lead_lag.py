"""Lead-lag of mismatch signals against the reward drop in collapsed runs.

If a collapse is mismatch-driven, the training-inference gap should grow
BEFORE the reward falls; if the step size drives it, the gap grows with or
after the fall (the policy moves into regions the engines disagree on). The
definitions, fixed before any run was looked at:

* drop: the collapse step the detector dates (trainer/analysis/collapse.py: the first
  step of the fall, corrected for the running median's lag).
* rise of a signal s (per-step k3, or routing inconsistency): its baseline is
  the median of s over the first ``BASELINE_STEPS = 10`` steps; s rises at the
  first step where its running median over ``WINDOW = 5`` steps exceeds
  ``FACTOR = 3`` x baseline for ``PERSIST = 3`` consecutive steps, dated as
  the first of those steps minus ``WINDOW // 2`` (the median's lag, as for
  the drop). 3x: the gap measures (k3) fluctuate several-fold step to step,
  but a 5-step median that stays at 3x its start for 3 steps is a change of
  level, and the control below counts how often runs that did NOT collapse
  show one (a rise that every run shows is not evidence).
  A rise must also clear an absolute floor, ``MIN_LEVEL`` per signal (k3
  1e-5, routing inconsistency 0.1%): with fp32 rollouts the k3 is 1e-13 to
  1e-7 (summation order alone), and a 3x change of that is not a gap.
* lead = drop - rise, in steps: positive when the signal rose first. A run
  whose signal never rises has no lead (reported as such, not as 0).

Rows are metrics.jsonl dicts with a ``step`` key.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BASELINE_STEPS = 10
WINDOW = 5
FACTOR = 3.0
PERSIST = 3
MIN_LEVEL = {"mismatch/kl_k3": 1e-5, "mismatch/routing_inconsistency": 1e-3}


def rise_step(
    steps: Sequence[int],
    values: Sequence[float | None],
    baseline_steps: int = BASELINE_STEPS,
    factor: float = FACTOR,
    window: int = WINDOW,
    persist: int = PERSIST,
    min_level: float = 0.0,
) -> int | None:
    """First step of a sustained rise of ``values`` above factor x its baseline (docstring)."""
    pairs = [
        (s, v) for s, v in zip(steps, values, strict=True) if v is not None and math.isfinite(v)
    ]
    if len(pairs) < baseline_steps + window:
        return None
    baseline = statistics.median(v for _, v in pairs[:baseline_steps])
    if baseline <= 0 and min_level <= 0:
        return None
    above_since, count = None, 0
    for i in range(window - 1, len(pairs)):
        median = statistics.median(v for _, v in pairs[i - window + 1 : i + 1])
        if median > max(factor * baseline, min_level):
            if above_since is None:
                above_since = i
            count += 1
            if count >= persist:
                return pairs[max(above_since - window // 2, 0)][0]
        else:
            above_since, count = None, 0
    return None


def run_rises(rows: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, int | None]:
    steps = [int(r["step"]) for r in rows]
    return {
        key: rise_step(steps, [r.get(key) for r in rows], min_level=MIN_LEVEL.get(key, 0.0))
        for key in keys
    }


@dataclass(frozen=True)
class LeadLagRow:
    signal: str
    collapsed_runs: int
    rose: int  # collapsed runs whose signal rose at all
    rose_before: int  # ... and strictly before the drop
    median_lead: float | None  # over collapsed runs with a rise, in steps
    leads: list[int]
    control_runs: int  # runs that did not collapse
    control_rose: int  # ... whose signal rose anyway


def lead_lag_table(runs: list[dict[str, Any]], keys: Sequence[str]) -> list[LeadLagRow]:
    """``runs``: dicts with ``rows`` (metrics), ``collapsed`` and ``collapse_step``."""
    table = []
    for key in keys:
        leads, rose, control_runs, control_rose, collapsed = [], 0, 0, 0, 0
        for run in runs:
            rise = run_rises(run["rows"], [key])[key]
            if run["collapsed"] and run["collapse_step"] is not None:
                collapsed += 1
                if rise is not None:
                    rose += 1
                    leads.append(int(run["collapse_step"]) - rise)
            else:
                control_runs += 1
                control_rose += rise is not None
        table.append(
            LeadLagRow(
                signal=key,
                collapsed_runs=collapsed,
                rose=rose,
                rose_before=sum(1 for lead in leads if lead > 0),
                median_lead=statistics.median(leads) if leads else None,
                leads=leads,
                control_runs=control_runs,
                control_rose=control_rose,
            )
        )
    return table
