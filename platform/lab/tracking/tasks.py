"""Celery tasks of the tracking app: thin, idempotent (the job is claimed first)."""

from __future__ import annotations

from celery import shared_task

from lab.tracking import tb_jobs


@shared_task(name=tb_jobs.IMPORT_TASK, acks_late=True, ignore_result=True)
def import_tensorboard(job_id: int) -> str:
    """A TensorBoard event folder into its external run (tracking/tb_jobs.py)."""
    return tb_jobs.run_import(int(job_id))


@shared_task(name="tracking.reconcile_imports", ignore_result=True)
def reconcile_imports() -> list[tuple[int, str]]:
    """Resend lost import messages, end imports whose worker died."""
    return tb_jobs.reconcile_imports()
