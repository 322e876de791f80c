"""Collapse across seeds with censoring (docs/design.md, section 3.6).

A run that never collapsed did not "collapse at its last step": we only know
it survived at least that long. It is *right-censored* at its step count, the
number of steps it ran (its last step + 1): it ran steps 0 .. N - 1 without a
collapse, so a collapse, if one ever came, would come at step N or later. The
one convention of every chart, table and the study report (docs/design.md 3.6).
Averaging censoring steps as if they were collapse steps would make a stable
variant look like one that collapses at the end of training, so:

* survival curves use the Kaplan-Meier product-limit estimator (Kaplan & Meier
  1958, "Nonparametric estimation from incomplete observations", JASA 53):
  S(t) = prod over collapse steps t_i <= t of (1 - d_i / n_i), with d_i runs
  collapsing at t_i and n_i runs still at risk (not collapsed and not censored
  before t_i; a run censored at t_i is still at risk at t_i);
* the mean collapse step of a variant with any censored seed is reported as a
  lower bound, ">= N", N being the mean over seeds that takes each censored
  run's step count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer.analysis.collapse import LOWER_BOUND_PREFIX as LOWER_BOUND_PREFIX  # re-exported
from trainer.analysis.collapse import CollapseSummary, summarize_collapses

Event = tuple[int, bool]  # (step, collapsed): collapse step, or step count if censored


@dataclass(frozen=True)
class RunOutcome:
    """How one run ended, as the survival analysis sees it.

    ``step`` is the collapse step when ``collapsed``, else the number of steps
    the run ran (its censoring step: a collapse would come then or later).
    """

    variant: str
    step: int
    collapsed: bool
    seed: int | None = None
    label: str = ""

    @property
    def event(self) -> Event:
        return (self.step, self.collapsed)

    @classmethod
    def from_summary(
        cls,
        variant: str,
        summary: Mapping[str, Any],
        *,
        last_step: int | None = None,
        seed: int | None = None,
        label: str = "",
    ) -> RunOutcome:
        """From a run's summary.json fields (``collapsed``, ``collapse_step``, ``steps``).

        A censored run is censored at ``last_step + 1`` when ``last_step`` is given
        (the last step in its metrics), else at ``summary["steps"]`` (the steps run).
        """
        if summary.get("collapsed"):
            step = summary.get("collapse_step")
            if step is None:
                raise ValueError(f"run {label or variant!r} collapsed without a collapse_step")
            return cls(variant, int(step), True, seed, label)
        end = last_step + 1 if last_step is not None else summary.get("steps")
        if end is None:
            raise ValueError(f"run {label or variant!r} has no step count to censor at")
        return cls(variant, int(end), False, seed, label)


def kaplan_meier(events: Iterable[Event]) -> tuple[list[int], list[float]]:
    """Kaplan-Meier survival: share of runs not yet collapsed, as a step function.

    events: (step, collapsed) per run. Returns (steps, survival): steps[0] = 0
    with survival 1, then one point per distinct event or censoring step
    (a second point at 0 only if a run collapsed at step 0); survival[i] holds
    from steps[i] until steps[i + 1] (draw with line_shape "hv"). Censoring
    steps are included (survival unchanged there) so the curve runs to the last
    step observed. No events -> ([], []).
    """
    ordered = sorted((int(step), bool(collapsed)) for step, collapsed in events)
    if not ordered:
        return [], []
    at_risk = len(ordered)
    survival = 1.0
    steps, values = [0], [1.0]
    i = 0
    while i < len(ordered):
        step = ordered[i][0]
        collapsed_here = censored_here = 0
        while i < len(ordered) and ordered[i][0] == step:
            if ordered[i][1]:
                collapsed_here += 1
            else:
                censored_here += 1
            i += 1
        if collapsed_here:
            survival *= 1.0 - collapsed_here / at_risk
        at_risk -= collapsed_here + censored_here
        if step == 0 and not collapsed_here:
            continue  # the curve already starts at (0, 1)
        steps.append(step)
        values.append(survival)
    return steps, values


def censor_marks(events: Iterable[Event]) -> tuple[list[int], list[float]]:
    """(step, survival at that step) of each censored run, for '+' tick marks on the curve."""
    event_list = list(events)
    steps, survival = kaplan_meier(event_list)
    marks_x, marks_y = [], []
    for step, collapsed in sorted(event_list):
        if collapsed:
            continue
        # Survival at a censoring step: the value of the last curve point at or before it.
        j = max(k for k, s in enumerate(steps) if s <= step)
        marks_x.append(int(step))
        marks_y.append(survival[j])
    return marks_x, marks_y


@dataclass(frozen=True)
class VariantCollapse(CollapseSummary):
    """trainer.analysis.collapse.CollapseSummary (the one censoring rule) named for its variant."""

    variant: str = ""


def summarize_outcomes(variant: str, outcomes: Sequence[RunOutcome | Event]) -> CollapseSummary:
    """Collapse summary of one variant's runs (RunOutcome or (step, collapsed) pairs)."""
    events = [o.event if isinstance(o, RunOutcome) else (int(o[0]), bool(o[1])) for o in outcomes]
    summary = summarize_collapses(events)
    return VariantCollapse(**summary.__dict__, variant=variant)


def collapse_summary(runs: Iterable[RunOutcome]) -> dict[str, CollapseSummary]:
    """Per variant (in first-seen order): mean collapse step over seeds with censoring."""
    by_variant: dict[str, list[RunOutcome]] = {}
    for run in runs:
        by_variant.setdefault(run.variant, []).append(run)
    return {v: summarize_outcomes(v, outcomes) for v, outcomes in by_variant.items()}
