"""Which runs of a stability review count as seeds of their variant.

A cancelled or failed run stopped for a reason that is not the training's
(someone pressed Cancel, a worker crashed, a config was rejected): by default
it is not a seed, so it moves neither the seed count nor the ">= N" bound of
its variant. The review's switch (``?stopped=1``) includes such runs; they
then enter the Kaplan-Meier curve censored at their last stored step (or at
their collapse step when they had collapsed before stopping), like any run
that has not collapsed. A lost run (an external run that sent nothing for
LAB_EXTERNAL_LOST_AFTER_S) is censored-unknown: never a seed, listed as left out.
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.runs.models import Run, RunStatus

STOPPED_STATUSES = (RunStatus.CANCELLED, RunStatus.FAILED)
# Censored-unknown: an external run that stopped reporting may have collapsed or not;
# it is never a seed (not even with stopped runs included), and the page names it.
UNKNOWN_STATUSES = (RunStatus.LOST,)

LOST_RULE = (
    " Lost runs (external runs that stopped reporting) are never seeds: their outcome is unknown."
)
SEED_RULE = (
    "Cancelled and failed runs are not seeds of their variant: they move neither "
    "the seed count nor the \u2265 N bound." + LOST_RULE
)
SEED_RULE_WITH_STOPPED = (
    "Cancelled and failed runs are included as seeds, censored at the steps they ran "
    "(or at their collapse step if they collapsed before stopping)." + LOST_RULE
)


def split_seeds(runs: Sequence[Run], *, include_stopped: bool) -> tuple[list[Run], list[Run]]:
    """(the runs that count as seeds, the stopped runs left out), each in the given order."""
    out = set(UNKNOWN_STATUSES) | (set() if include_stopped else set(STOPPED_STATUSES))
    seeds = [r for r in runs if r.status not in out]
    left_out = [r for r in runs if r.status in out]
    return seeds, left_out


def seed_rule(include_stopped: bool) -> str:
    """The rule in force, as the page states it."""
    return SEED_RULE_WITH_STOPPED if include_stopped else SEED_RULE
