"""Send the wake-up for a run to its hardware queue (after the row is committed)."""

from __future__ import annotations

import uuid

from django.db import transaction

EXECUTE_RUN = "jobs.tasks.execute_run"
RECONCILE = "jobs.tasks.reconcile"
MAX_PRIORITY = 9


def new_task_id() -> str:
    return str(uuid.uuid4())


def send_run(run_id: int, queue: str, priority: int, task_id: str) -> None:
    """Publish now. The message carries only the id: the Run row is the state of record."""
    from labsite.celery import app

    # Redis orders priorities 0 (first) .. 9; Run.priority is "higher runs first".
    app.send_task(
        EXECUTE_RUN,
        args=[run_id],
        queue=queue,
        task_id=task_id,
        priority=MAX_PRIORITY - priority,
    )


def send_run_on_commit(run_id: int, queue: str, priority: int, task_id: str) -> None:
    """Publish once the surrounding transaction commits, so a worker always finds the row."""
    transaction.on_commit(lambda: send_run(run_id, queue, priority, task_id))
