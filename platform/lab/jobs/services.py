"""Worker-side writes: claim, heartbeat, finish, requeue. Each is a conditional
UPDATE on (id, status, attempts) so at most one actor wins every transition:

    queued --claim--> running --finish--> succeeded | failed | cancelled
       ^                 |
       +---requeue-------+   (heartbeat stale, attempts left; else -> failed; a trainer
                                 interrupted by its worker's shutdown: the attempt unspent)

The database decides what runs next: a wake-up claims the highest-priority,
oldest queued run of its queue (``claim_next``), the order the pages show as
the queue position (jobs/queries.py). ``attempts`` is the fencing token:
each claim increments it and every later write of the attempt is checked
against it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from lab.jobs.models import Worker
from lab.runs.dispatch import new_task_id, send_run_on_commit, waiting_messages
from lab.runs.metrics.ingest import StaleAttempt, drop_metrics_after, ingest_metrics
from lab.runs.metrics.seal import seal_metrics
from lab.runs.models import Run, RunOrigin, RunStatus
from lab.runs.queue_order import QUEUE_ORDER
from trainer.run_folder.files import METRICS_FILE, parse_metric_lines

log = logging.getLogger("jobs")


@dataclass(frozen=True)
class Claim:
    """What a worker holds after claiming: the attempt number fences later writes."""

    run_id: int
    attempt: int
    node: int = 0  # a gang's member number (lab/jobs/gang.py); 0 leads, and a lone run is 0


# Candidates looked at per claim: another worker may take the first ones meanwhile.
CLAIM_CANDIDATES = 8


def claim_run(run_id: int, *, worker_host: str, gpu_index: str = "") -> Claim | None:
    """queued -> running in one conditional UPDATE; None when another delivery,
    a cancel or a finished run got there first (the caller just returns)."""
    now = timezone.now()
    with transaction.atomic():
        won = Run.objects.filter(pk=run_id, status=RunStatus.QUEUED, paused=False).update(
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


def claim_next(
    queue: str, *, worker_host: str, gpu_index: str = "", max_ranks_per_node: int | None = None
) -> Claim | None:
    """Claim the highest-priority, oldest queued run of ``queue`` that fits this
    worker (``Run.gpus <= max_ranks_per_node``; None: any); None when none is left.

    Whatever message woke the worker, the database picks the run, so the order
    runs start is the queue position the pages show even on a broker that
    ignores message priorities (the filesystem transport). Each message claims
    at most one run and every queued run was published once, so no run is left
    without a wake-up; a message that finds nothing is a no-op.

    PostgreSQL: ``SKIP LOCKED`` lets concurrent workers take different rows;
    SQLite: IMMEDIATE transactions serialise the claims. The conditional
    UPDATE in ``claim_run`` is the last word either way.
    """
    while True:
        with transaction.atomic():
            candidates = list(
                Run.objects.select_for_update(skip_locked=True)
                .filter(
                    queue=queue, status=RunStatus.QUEUED, paused=False, **_fits(max_ranks_per_node)
                )
                .order_by(*QUEUE_ORDER)
                .values_list("pk", "gpus")[:CLAIM_CANDIDATES]
            )
            for run_id, ranks in candidates:
                # The devices the trainer will see: this worker's first ``ranks``.
                used = ",".join(gpu_index.split(",")[:ranks]) if gpu_index else ""
                claim = claim_run(run_id, worker_host=worker_host, gpu_index=used)
                if claim is not None:
                    return claim
        if not candidates:
            return None


def _fits(max_ranks_per_node: int | None) -> dict[str, int]:
    return {} if max_ranks_per_node is None else {"gpus__lte": max_ranks_per_node}


def heartbeat(claim: Claim, current_step: int | None = None) -> bool:
    """Record liveness; returns False when this attempt no longer owns the run
    (requeued as stale, or already finished): the caller must stop its trainer.
    Cancel and pause requests are read separately by ``stop_requested``."""
    fields: dict[str, Any] = {"heartbeat_at": timezone.now()}
    if current_step is not None:
        fields["current_step"] = current_step
    owned = Run.objects.filter(
        pk=claim.run_id, status=RunStatus.RUNNING, attempts=claim.attempt
    ).update(**fields)
    return bool(owned)


def stop_requested(claim: Claim) -> str:
    """Why the run's trainer should stop now: "cancel" (the user cancelled it),
    "pause" (its sweep was paused) or "" (neither)."""
    flags = Run.objects.filter(pk=claim.run_id).values_list("cancel_requested", "paused").first()
    if flags is None:
        return ""
    cancel, paused = flags
    return "cancel" if cancel else "pause" if paused else ""


def finish_run(
    claim: Claim,
    *,
    status: str,
    summary: dict[str, Any] | None,
    error: str = "",
    current_step: int | None = None,
    field_errors: dict[str, list[str]] | None = None,
) -> bool:
    """running -> final status, fenced by the attempt; False if this attempt lost the run.
    ``field_errors``: the config fields a run failed on ({path: [messages]})."""
    fields: dict[str, Any] = {
        "status": status,
        "summary": summary,
        "error": error[-20000:],
        "field_errors": field_errors or {},
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
        seal_metrics(claim.run_id)
    return won


def requeue_attempt(
    claim: Claim, *, error: str, current_step: int | None = None, spent: bool = True
) -> bool:
    """running -> queued for another attempt, fenced by this one, with a new
    wake-up published on commit; False if this attempt had already lost the run.

    ``spent=False`` gives the attempt back unspent (a worker's graceful
    shutdown): ``attempts`` is the fencing token and never goes back (a late
    write of this attempt must stay fenced out once the next claim takes
    ``attempts + 1``), so the allowance ``max_attempts`` grows by one instead."""
    task_id = new_task_id()
    fields: dict[str, Any] = {
        "status": RunStatus.QUEUED,
        "task_id": task_id,
        "worker_host": "",
        "published_at": timezone.now(),
        "error": error,
    }
    if current_step is not None:
        fields["current_step"] = current_step
    if not spent:
        fields["max_attempts"] = F("max_attempts") + 1
    with transaction.atomic():
        run = Run.objects.only("queue", "priority").get(pk=claim.run_id)
        requeued = Run.objects.filter(
            pk=claim.run_id, status=RunStatus.RUNNING, attempts=claim.attempt
        ).update(**fields)
        if requeued:
            send_run_on_commit(run.pk, run.queue, run.priority, task_id)
    return bool(requeued)


@dataclass(frozen=True)
class ReconcileAction:
    run_id: int
    action: str  # "requeued" | "failed" | "cancelled" | "republished"
    attempts: int


def reconcile_stale_runs(stale_after_s: float) -> list[ReconcileAction]:
    """Requeue running runs whose worker stopped heartbeating; fail those out of attempts.

    The requeue is fenced on (status, attempts, heartbeat) so a worker that
    heartbeats at the same moment keeps its run. The new attempt is published
    with a fresh task id and resumes from the run folder's last checkpoint.
    A run whose cancel was asked for ends cancelled instead of training again.
    Before a run ends here, the run folder's metrics file is ingested, so the
    database holds exactly the steps the trainer wrote.
    """
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    actions = []
    # An external run (trained elsewhere, logged here) has no worker to lose.
    stale = Run.objects.filter(
        status=RunStatus.RUNNING, origin=RunOrigin.LAB, heartbeat_at__lt=cutoff
    ).values_list(
        "pk", "attempts", "max_attempts", "queue", "priority", "cancel_requested", "run_dir"
    )
    for run_id, attempts, max_attempts, queue, priority, cancelling, run_dir in stale:
        fence = Run.objects.filter(
            pk=run_id, status=RunStatus.RUNNING, attempts=attempts, heartbeat_at__lt=cutoff
        )
        if cancelling or attempts >= max_attempts:
            claim = Claim(run_id, attempts)
            steps = _ingest_run_file(claim, Path(run_dir)) if run_dir else None
            final = RunStatus.CANCELLED if cancelling else RunStatus.FAILED
            fields = {"status": final, "finished_at": timezone.now()}
            if not cancelling:
                fields["error"] = f"worker lost {attempts} times (max_attempts={max_attempts})"
            if steps is not None:
                fields["current_step"] = steps
            if fence.update(**fields):
                actions.append(ReconcileAction(run_id, str(final), attempts))
            continue
        task_id = new_task_id()
        with transaction.atomic():
            if fence.update(
                status=RunStatus.QUEUED,
                task_id=task_id,
                queued_at=timezone.now(),
                published_at=timezone.now(),
                worker_host="",
                error=f"attempt {attempts} lost its worker; requeued",
            ):
                send_run_on_commit(run_id, queue, priority, task_id)
                actions.append(ReconcileAction(run_id, "requeued", attempts))
    for action in actions:
        log.warning("reconciler: run %s %s after attempt %s", *_fields(action))
        if action.action in (RunStatus.FAILED, RunStatus.CANCELLED):  # final: keep as columns
            seal_metrics(action.run_id)
    return actions


def _fields(action: ReconcileAction) -> tuple[int, str, int]:
    return action.run_id, action.action, action.attempts


def _ingest_run_file(claim: Claim, run_dir: Path) -> int | None:
    """Make the stored metrics equal the run folder's metrics file (the steps a
    lost worker never ingested); returns the steps stored, None without a
    readable file or when another attempt owns the run now."""
    try:
        blob = (run_dir / METRICS_FILE).read_bytes()
    except OSError:
        return None
    records, _partial = parse_metric_lines(blob)
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    if not steps:
        return None
    try:
        ingest_metrics(claim.run_id, records, attempt=claim.attempt)
        drop_metrics_after(claim.run_id, max(steps), attempt=claim.attempt)
    except StaleAttempt:
        return None
    return max(steps) + 1


def republish_queued_runs(republish_after_s: float) -> list[ReconcileAction]:
    """Wake-ups for queued runs the broker lost (a Redis restart without its
    data, a publish that failed at submit, a worker that died holding the message).

    Per queue, the runs queued longer than ``republish_after_s`` that the waiting
    messages do not cover get one new message each; the broker's count is
    best-effort (unknown: every such run gets one). A duplicate is harmless:
    the claim is idempotent and a message without a run to claim is a no-op.
    """
    cutoff = timezone.now() - timedelta(seconds=republish_after_s)
    actions = []
    unpublished = Q(published_at__lt=cutoff) | Q(published_at__isnull=True)
    # A paused run waits for its resume, which publishes its wake-up.
    queues = (
        Run.objects.filter(unpublished, status=RunStatus.QUEUED, paused=False)
        .values_list("queue", flat=True)
        .distinct()
    )
    for queue in sorted(set(queues)):
        queued = Run.objects.filter(queue=queue, status=RunStatus.QUEUED, paused=False)
        waiting = waiting_messages(queue)
        missing = queued.count() - waiting if waiting is not None else queued.count()
        if missing <= 0:
            continue
        lost = queued.filter(unpublished).order_by(*QUEUE_ORDER)
        for run_id, priority, attempts in lost.values_list("pk", "priority", "attempts")[:missing]:
            task_id = new_task_id()
            # published_at moves on, so a run is republished at most once per period.
            if Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
                task_id=task_id, published_at=timezone.now()
            ):
                send_run_on_commit(run_id, queue, priority, task_id)
                actions.append(ReconcileAction(run_id, "republished", attempts))
    for action in actions:
        log.warning("reconciler: run %s %s (queued, attempt %s)", *_fields(action))
    return actions


def register_worker(
    hostname: str,
    *,
    queues: list[str],
    pid: int,
    gpu_index: str = "",
    gpus: int = 0,
    cpu_slots: int = 1,
    current_run_id=None,
    beat_pid: int | None = None,
    beat_alive: bool | None = None,
) -> None:
    """Upsert the live-worker row (called every few seconds by each worker; the
    reconciler's also says whether its embedded scheduler lives)."""
    Worker.objects.update_or_create(
        hostname=hostname,
        defaults={
            "queues": queues,
            "pid": pid,
            "gpu_index": gpu_index,
            "gpus": gpus,
            "cpu_slots": cpu_slots,
            "last_seen": timezone.now(),
            "current_run_id": current_run_id,
            "beat_pid": beat_pid,
            "beat_alive": beat_alive,
        },
    )


def unregister_worker(hostname: str) -> None:
    Worker.objects.filter(hostname=hostname).delete()
