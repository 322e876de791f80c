"""Worker-side writes: claim, heartbeat, finish, requeue. Each is a conditional
UPDATE on (id, status, attempts) so at most one actor wins every transition:

    queued --claim--> running --finish--> succeeded | failed | cancelled
       ^                 |
       +---requeue-------+   (heartbeat stale, attempts left; else -> failed)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.dispatch import new_task_id, send_run_on_commit
from jobs.models import Worker
from runs import services as run_services
from runs.models import Run, RunStatus

log = logging.getLogger("jobs")


@dataclass(frozen=True)
class Claim:
    """What a worker holds after claiming: the attempt number fences later writes."""

    run_id: int
    attempt: int


def claim_run(run_id: int, *, worker_host: str, gpu_index: str = "") -> Claim | None:
    """queued -> running in one conditional UPDATE; None when another delivery,
    a cancel or a finished run got there first (the caller just returns)."""
    now = timezone.now()
    with transaction.atomic():
        won = Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
            status=RunStatus.RUNNING,
            attempts=F("attempts") + 1,
            worker_host=worker_host,
            gpu_index=gpu_index,
            started_at=now,
            heartbeat_at=now,
            error="",
        )
        if not won:
            return None
        attempt = Run.objects.values_list("attempts", flat=True).get(pk=run_id)
    return Claim(run_id, attempt)


def heartbeat(claim: Claim, current_step: int | None = None) -> bool:
    """Record liveness; returns False when this attempt no longer owns the run
    (requeued as stale, or already finished): the caller must stop its trainer.
    Cancel requests are read separately by ``cancel_requested``."""
    fields: dict[str, Any] = {"heartbeat_at": timezone.now()}
    if current_step is not None:
        fields["current_step"] = current_step
    owned = Run.objects.filter(
        pk=claim.run_id, status=RunStatus.RUNNING, attempts=claim.attempt
    ).update(**fields)
    return bool(owned)


def cancel_requested(claim: Claim) -> bool:
    return bool(Run.objects.filter(pk=claim.run_id, cancel_requested=True).exists())


def finish_run(
    claim: Claim,
    *,
    status: str,
    summary: dict[str, Any] | None,
    error: str = "",
    current_step: int | None = None,
) -> bool:
    """running -> final status, fenced by the attempt; False if this attempt lost the run."""
    fields: dict[str, Any] = {
        "status": status,
        "summary": summary,
        "error": error[-20000:],
        "finished_at": timezone.now(),
        "heartbeat_at": timezone.now(),
    }
    if current_step is not None:
        fields["current_step"] = current_step
    won = bool(
        Run.objects.filter(
            pk=claim.run_id, status=RunStatus.RUNNING, attempts=claim.attempt
        ).update(**fields)
    )
    if won:  # final now: its metrics no longer change, keep them as columns
        run_services.seal_metrics(claim.run_id)
    return won


@dataclass(frozen=True)
class ReconcileAction:
    run_id: int
    action: str  # "requeued" | "failed"
    attempts: int


def reconcile_stale_runs(stale_after_s: float) -> list[ReconcileAction]:
    """Requeue running runs whose worker stopped heartbeating; fail those out of attempts.

    The requeue is fenced on (status, attempts, heartbeat) so a worker that
    heartbeats at the same moment keeps its run. The new attempt is published
    with a fresh task id and resumes from the run folder's last checkpoint.
    """
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    actions = []
    stale = Run.objects.filter(status=RunStatus.RUNNING, heartbeat_at__lt=cutoff).values_list(
        "pk", "attempts", "max_attempts", "queue", "priority"
    )
    for run_id, attempts, max_attempts, queue, priority in stale:
        fence = Run.objects.filter(
            pk=run_id, status=RunStatus.RUNNING, attempts=attempts, heartbeat_at__lt=cutoff
        )
        with transaction.atomic():
            if attempts >= max_attempts:
                if fence.update(
                    status=RunStatus.FAILED,
                    finished_at=timezone.now(),
                    error=f"worker lost {attempts} times (max_attempts={max_attempts})",
                ):
                    actions.append(ReconcileAction(run_id, "failed", attempts))
                continue
            task_id = new_task_id()
            if fence.update(
                status=RunStatus.QUEUED,
                task_id=task_id,
                queued_at=timezone.now(),
                worker_host="",
                error=f"attempt {attempts} lost its worker; requeued",
            ):
                send_run_on_commit(run_id, queue, priority, task_id)
                actions.append(ReconcileAction(run_id, "requeued", attempts))
    for action in actions:
        log.warning("reconciler: run %s %s after attempt %s", *_fields(action))
        if action.action == "failed":  # final now: keep its metrics as columns
            run_services.seal_metrics(action.run_id)
    return actions


def _fields(action: ReconcileAction) -> tuple[int, str, int]:
    return action.run_id, action.action, action.attempts


def register_worker(
    hostname: str, *, queues: list[str], pid: int, gpu_index: str = "", current_run_id=None
) -> None:
    """Upsert the live-worker row (called every few seconds by each worker)."""
    Worker.objects.update_or_create(
        hostname=hostname,
        defaults={
            "queues": queues,
            "pid": pid,
            "gpu_index": gpu_index,
            "last_seen": timezone.now(),
            "current_run_id": current_run_id,
        },
    )


def unregister_worker(hostname: str) -> None:
    Worker.objects.filter(hostname=hostname).delete()
