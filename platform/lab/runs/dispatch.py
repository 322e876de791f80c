"""Send wake-ups to a hardware queue (after the row is committed).

A message carries a run id, but it only wakes a worker: the worker claims the
best runnable run of that queue from the database (jobs.services.claim_next),
so a lost, duplicated or out-of-order message never changes what runs, or in
which order. The reconciler re-sends wake-ups for queued runs the broker lost.
"""

from __future__ import annotations

import logging
import uuid

from django.db import transaction

log = logging.getLogger("jobs")

EXECUTE_RUN = "jobs.tasks.execute_run"
MAX_PRIORITY = 9


class PublishFailed(Exception):
    """The broker did not take the message (down, unreachable). The run stays
    queued in the database; the reconciler publishes it again later."""

    def __init__(self, run_id: int, message: str):
        super().__init__(message)
        self.run_id = run_id


def new_task_id() -> str:
    return str(uuid.uuid4())


def send_run(run_id: int, queue: str, priority: int, task_id: str) -> None:
    """Publish now; ``PublishFailed`` when the broker refuses or cannot be reached."""
    from celery import (
        current_app as app,
    )  # lab.site.celery's app (design.md 1.2)

    try:
        with app.connection_for_write() as conn:
            # Fail fast (one connection try, ~2 s on a refused Redis instead of ~6 s
            # through the producer pool's retries): the caller answers 503 or
            # leaves the run to the reconciler.
            conn.ensure_connection(max_retries=1)
            # Redis orders priorities 0 (first) .. 9; Run.priority is "higher runs first".
            app.send_task(
                EXECUTE_RUN,
                args=[run_id],
                queue=queue,
                task_id=task_id,
                priority=MAX_PRIORITY - priority,
                connection=conn,
                retry=False,
            )
    except Exception as exc:  # kombu/redis raise many types for "broker down"
        raise PublishFailed(
            run_id, f"could not publish run {run_id} to queue '{queue}': {exc}"
        ) from exc


def send_run_on_commit(
    run_id: int, queue: str, priority: int, task_id: str, *, raise_on_failure: bool = False
) -> None:
    """Publish once the surrounding transaction commits, so a worker always finds the row.

    With ``raise_on_failure`` a ``PublishFailed`` leaves the outermost atomic
    block (the row is committed by then), so a submit can answer 503; without
    it the failure is logged and the reconciler re-publishes.
    """

    def publish() -> None:
        try:
            send_run(run_id, queue, priority, task_id)
        except PublishFailed:
            if raise_on_failure:
                raise
            log.warning("run %s: publish failed; the reconciler will re-publish it", run_id)

    transaction.on_commit(publish)


def waiting_messages(queue: str) -> int | None:
    """Messages waiting in ``queue`` (not yet delivered), or None when the broker
    cannot say: the reconciler then re-publishes rather than risk a stuck run."""
    from celery import (
        current_app as app,
    )  # lab.site.celery's app (design.md 1.2)

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
            return int(conn.default_channel.queue_declare(queue, passive=True).message_count)
    except Exception:
        return None
