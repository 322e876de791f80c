"""Celery tasks: thin wrappers over jobs.supervisor and jobs.services.

``execute_run`` is idempotent: it claims the run atomically and a second
delivery of the same message (Redis visibility timeout, a requeue racing a
slow worker) finds the run claimed and returns at once.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from jobs import services, supervisor
from runs import services as run_services


@shared_task(name="jobs.tasks.execute_run", bind=True, acks_late=True, ignore_result=True)
def execute_run(self, run_id: int) -> str:
    return supervisor.execute(int(run_id), worker_host=self.request.hostname or "worker")


@shared_task(name="jobs.tasks.reconcile", ignore_result=True)
def reconcile() -> list[tuple[int, str]]:
    actions = services.reconcile_stale_runs(settings.LAB_STALE_AFTER_S)
    # Final runs without metric columns (finished before columns existed, or
    # rows rewritten by a lost worker afterwards): the compare pages read faster.
    run_services.seal_unsealed_runs()
    return [(a.run_id, a.action) for a in actions]
