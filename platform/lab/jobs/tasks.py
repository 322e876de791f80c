"""Celery tasks: thin wrappers over jobs.supervisor and jobs.services.

``execute_run`` is a wake-up: it claims the best queued run of the message's
queue (the database decides the order) and trains it. It is idempotent: a
second delivery finds nothing left to claim, or claims the next run, which
was going to get a wake-up of its own. A failure before the claim (the
database unreachable) is retried with backoff instead of being acknowledged
away, so the wake-up is never lost; after the claim the run's heartbeat and
the reconciler take over.
"""

from __future__ import annotations

from celery import shared_task
from celery.exceptions import Reject
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from lab.assets import services as assets
from lab.jobs import services, supervisor
from lab.jobs.worker_state import SHUTDOWN
from lab.runs import exports, lifecycle
from lab.runs.metrics.seal import seal_unsealed_runs

CLAIM_RETRY_MAX_S = 60


def claim_retry_delay(retries: int) -> int:
    """Backoff before retrying a claim: 1, 2, 4, ... seconds, at most CLAIM_RETRY_MAX_S."""
    return min(CLAIM_RETRY_MAX_S, 2**retries)


@shared_task(
    name="jobs.tasks.execute_run", bind=True, acks_late=True, ignore_result=True, max_retries=None
)
def execute_run(self, run_id: int) -> str:
    host = self.request.hostname or "worker"
    if SHUTDOWN.is_set():
        # A worker in warm shutdown can still be handed a message (the filesystem
        # transport's consumer polls until the pool stops), often the very run it
        # just gave back. Claiming would spend a fencing number on a trainer that
        # stops at once; the message goes back to the broker for the next worker.
        raise Reject("worker shutting down", requeue=True)
    try:
        claim = supervisor.claim_for_wake_up(int(run_id), worker_host=host)
    except DatabaseError as exc:
        close_old_connections()  # a broken connection is reopened on the next try
        raise self.retry(exc=exc, countdown=claim_retry_delay(self.request.retries)) from exc
    if claim is None:
        return "skipped"
    return supervisor.execute_claim(claim)


@shared_task(name=assets.CHECK_DATASET_TASK, acks_late=True, ignore_result=True)
def check_dataset(dataset_id: int) -> str:
    """Check a large registered dataset's file (assets/services.check_dataset)."""
    return assets.check_dataset(int(dataset_id))


@shared_task(name=assets.CHECK_MODEL_TASK, acks_late=True, ignore_result=True)
def check_model(model_id: int) -> str:
    """Scan a large registered checkpoint's weights (assets/services.check_model)."""
    return assets.check_model(int(model_id))


@shared_task(name=exports.EXPORT_TASK, acks_late=True, ignore_result=True)
def export_checkpoint(export_id: int) -> str:
    """Write a run's checkpoint as a Hugging Face folder (runs/exports.py)."""
    return exports.run_export(int(export_id))


@shared_task(name="jobs.tasks.reconcile", ignore_result=True)
def reconcile() -> list[tuple[int, str]]:
    actions = services.reconcile_stale_runs(settings.LAB_STALE_AFTER_S)
    # Queued runs whose wake-up the broker lost (restarted without its data, a
    # publish that failed at submit): the database is the queue of record.
    actions += services.republish_queued_runs(settings.LAB_REPUBLISH_AFTER_S)
    # External runs that stopped reporting (a job killed without ending its run).
    lifecycle.mark_lost_external_runs(settings.LAB_EXTERNAL_LOST_AFTER_S)
    # Final runs without metric columns (finished before columns existed, or
    # rows rewritten by a lost worker afterwards): the compare pages read faster.
    seal_unsealed_runs()
    return [(a.run_id, a.action) for a in actions]
