"""The queue's one order: priority (higher first), then age (older first), then id.

A worker claims queued runs in this order (lab/jobs/services.py), a gang is
joined in it (lab/jobs/gang.py), a run's place is counted in it
(lab/jobs/queries.py), and the API's queue and the queue page list runs in it:
the place a page shows is the turn the run gets.
"""

from __future__ import annotations

from django.db.models import Q, QuerySet

from lab.runs.models import Run

QUEUE_ORDER = ("-priority", "created_at", "pk")


def in_queue_order(runs: QuerySet[Run], *, by_queue: bool = False) -> QuerySet[Run]:
    """``runs`` in the queue's order; ``by_queue``: grouped by queue name first."""
    return runs.order_by(*(("queue",) if by_queue else ()), *QUEUE_ORDER)


def ahead_of(run: Run) -> Q:
    """The runs that come before ``run`` in the queue's order (its queue aside)."""
    return (
        Q(priority__gt=run.priority)
        | Q(priority=run.priority, created_at__lt=run.created_at)
        | Q(priority=run.priority, created_at=run.created_at, pk__lt=run.pk)
    )
