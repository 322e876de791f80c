"""Actions on many runs at once (cancel; a sweep's pause, resume and clear), and
putting a finished run back in the queue.

Bulk cancel goes through ``lifecycle.cancel_run`` run by run, so each run
gets exactly the single-run treatment (a queued run is cancelled at once, a
training run gets the flag its worker polls) and the rights check; runs the
user may not change are counted, never touched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from lab.experiments.models import Sweep
from lab.runs import lifecycle
from lab.runs.dispatch import new_task_id, send_run_on_commit
from lab.runs.models import ACTIVE_STATUSES, Run, RunStatus

REQUEUEABLE_STATUSES = (RunStatus.FAILED, RunStatus.CANCELLED)


@dataclass
class BulkOutcome:
    """What a bulk action did, for the page's message."""

    done: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # finished already, or not allowed
    external: list[int] = field(default_factory=list)  # trained elsewhere: never touched

    def message(self, verb: str) -> str:
        text = f"{verb} {len(self.done)} run{'s' if len(self.done) != 1 else ''}"
        if self.skipped:
            text += f"; {len(self.skipped)} left as they were (finished or not yours)"
        if self.external:
            n = len(self.external)
            text += f"; {n} external run{'s' if n != 1 else ''} left alone (trained elsewhere)"
        return text + "."


def cancel_runs(run_ids: Iterable[int], *, user) -> BulkOutcome:
    """Cancel each queued or training run of ``run_ids`` the user may manage."""
    outcome = BulkOutcome()
    runs = Run.objects.filter(pk__in=list(run_ids)).order_by("pk")
    for run in runs:
        if run.is_external:
            outcome.external.append(run.pk)
            continue
        if run.status not in ACTIVE_STATUSES or not run.can_manage(user):
            outcome.skipped.append(run.pk)
            continue
        lifecycle.cancel_run(run, user=user)
        outcome.done.append(run.pk)
    return outcome


def cancel_sweep(sweep: Sweep, *, user) -> BulkOutcome:
    """Cancel every run of a sweep that is still queued or training."""
    return cancel_runs(sweep.runs.values_list("pk", flat=True), user=user)


def _sweep_runs(sweep: Sweep, user, outcome: BulkOutcome, **filters):
    """The sweep's runs matching ``filters`` that ``user`` may change; the others
    are counted in ``outcome`` and never touched."""
    for run in sweep.runs.filter(**filters).order_by("pk"):
        if run.is_external:
            outcome.external.append(run.pk)
        elif not run.can_manage(user):
            outcome.skipped.append(run.pk)
        else:
            yield run


def pause_sweep(sweep: Sweep, *, user) -> BulkOutcome:
    """Hold a sweep's unfinished runs: a queued one stays queued but no worker
    claims it; a training one stops at its next step, checkpoints and comes back
    queued and held with its attempt given back (lab/jobs/outcome.py, "pause").
    Finished runs, and every result stored, are left as they are."""
    outcome = BulkOutcome()
    for run in _sweep_runs(sweep, user, outcome, status__in=ACTIVE_STATUSES, paused=False):
        if Run.objects.filter(pk=run.pk, status__in=ACTIVE_STATUSES).update(paused=True):
            outcome.done.append(run.pk)
    return outcome


def resume_sweep(sweep: Sweep, *, user) -> BulkOutcome:
    """Queue a paused sweep's runs again, each where its priority and age put it,
    with a fresh wake-up; a run still stopping for the pause comes back queued and
    is woken by its own requeue."""
    outcome = BulkOutcome()
    for run in _sweep_runs(sweep, user, outcome, paused=True):
        with transaction.atomic():
            task_id = new_task_id()
            if Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED, paused=True).update(
                paused=False, task_id=task_id, published_at=timezone.now()
            ):
                send_run_on_commit(run.pk, run.queue, run.priority, task_id)
            else:
                Run.objects.filter(pk=run.pk).update(paused=False)
        outcome.done.append(run.pk)
    return outcome


def clear_sweep(sweep: Sweep, *, user) -> BulkOutcome:
    """Take a sweep's unfinished runs out of the queue for good: a waiting one
    (queued or paused) is deleted, a training one is cancelled (it stops at a
    checkpoint and keeps the steps it stored). Finished runs stay, and so does
    their review."""
    outcome = BulkOutcome()
    for run in _sweep_runs(sweep, user, outcome, status__in=ACTIVE_STATUSES):
        try:
            lifecycle.delete_run(run, user=user)
        except lifecycle.InvalidState:  # training (or claimed meanwhile): stop it instead
            lifecycle.cancel_run(run, user=user)
        outcome.done.append(run.pk)
    return outcome


def requeue_run(run: Run, *, user) -> Run:
    """Put a failed or cancelled run back in its queue; it resumes from its last
    checkpoint (the worker passes --resume when one exists) and keeps its metrics.

    ``attempts`` keeps counting, so a late write from an earlier attempt stays
    fenced out; the run gets a fresh allowance of attempts on top of it.
    """
    if not run.can_manage(user):
        raise lifecycle.NotAllowed("only the run's owner or staff can requeue it")
    if run.is_external:  # no config a worker could train: it was trained elsewhere
        raise lifecycle.InvalidState(
            "an external run is trained elsewhere; the lab cannot requeue it"
        )
    if run.failed_on_config:  # the same config would be refused the same way
        fields = ", ".join(sorted(run.field_errors))
        raise lifecycle.InvalidState(
            f"run {run.pk} failed on its config ({fields}): a requeue would fail the same "
            "way; Clone and fix it instead"
        )
    with transaction.atomic():
        task_id = new_task_id()
        updated = Run.objects.filter(pk=run.pk, status__in=REQUEUEABLE_STATUSES).update(
            status=RunStatus.QUEUED,
            cancel_requested=False,
            paused=False,
            finished_at=None,
            error="",
            summary=None,
            phase="",
            phase_progress=None,
            task_id=task_id,
            queued_at=timezone.now(),
            max_attempts=run.attempts + settings.LAB_MAX_ATTEMPTS,
        )
        if not updated:
            raise lifecycle.InvalidState("only a failed or cancelled run can be requeued")
        send_run_on_commit(run.pk, run.queue, run.priority, task_id)
    run.refresh_from_db()
    return run


def requeue_runs(run_ids: Iterable[int], *, user) -> BulkOutcome:
    """Requeue each failed or cancelled run of ``run_ids`` the user may manage."""
    outcome = BulkOutcome()
    for run in Run.objects.filter(pk__in=list(run_ids)).order_by("pk"):
        if run.is_external:
            outcome.external.append(run.pk)
            continue
        try:
            requeue_run(run, user=user)
            outcome.done.append(run.pk)
        except (lifecycle.NotAllowed, lifecycle.InvalidState):
            outcome.skipped.append(run.pk)
    return outcome
