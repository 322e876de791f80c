"""Where a run stands, for the API and the pages: queue position, ETA, placement line.

Metric reads are the metric store's (runs/metrics/read.py)."""

from __future__ import annotations

from collections.abc import Iterable

from django.utils import timezone

from lab.jobs.health import LIVE_WITHIN_S
from lab.jobs.models import Worker
from lab.runs.models import Run, RunStatus
from lab.runs.queue_order import ahead_of, in_queue_order


def queue_position(run: Run) -> int | None:
    """1-based place among the queued runs of the same queue, in the queue's order
    (lab/runs/queue_order.py: priority, then age): the turn a worker gives it. None
    for a run that is not queued or is paused (no worker claims it)."""
    if run.status != RunStatus.QUEUED or run.paused:
        return None
    queued = Run.objects.filter(queue=run.queue, status=RunStatus.QUEUED, paused=False)
    ahead = queued.filter(ahead_of(run))
    return ahead.count() + 1


def queue_positions(runs: Iterable[Run]) -> dict[int, int]:
    """``{run id: queue_position(run)}`` for the queued runs among ``runs``, in ONE
    query whatever their number (a list page must not ask once per row).

    Reads the ids and queues of every queued run in the queues involved, in the
    queue's order, and numbers them as ``queue_position`` does.
    """
    wanted = {
        run.pk: run.queue for run in runs if run.status == RunStatus.QUEUED and not run.paused
    }
    if not wanted:
        return {}
    queued = Run.objects.filter(
        status=RunStatus.QUEUED, paused=False, queue__in=set(wanted.values())
    )
    rows = in_queue_order(queued, by_queue=True).values_list("pk", "queue")
    positions: dict[int, int] = {}
    queue, place = None, 0
    for pk, row_queue in rows.iterator(chunk_size=2000):
        if row_queue != queue:
            queue, place = row_queue, 0
        place += 1
        if pk in wanted:
            positions[pk] = place
    return positions


def eta_seconds(run: Run) -> float | None:
    """Remaining time from this attempt's pace so far (None until a step is stored)."""
    if run.status != RunStatus.RUNNING or not run.started_at or run.current_step <= 0:
        return None
    # Pace of this attempt; a resumed attempt's warm-start time and earlier
    # steps make this a rough figure, which is all a queue page needs.
    elapsed = (timezone.now() - run.started_at).total_seconds()
    if elapsed <= 0:
        return None
    rate = run.current_step / elapsed
    return max(0.0, (run.total_steps - run.current_step) / rate)


def placement_text(run: Run) -> str:
    """Where the run stands, one line for the run page's header and its status poll:
    "position 2 in cpu · attempt 0/3", "queue cpu · worker w1 GPU 0 · attempt 1/3 · ETA 40 s"."""
    position = queue_position(run)
    if run.waits_paused:
        parts = [f"paused in {run.queue} (resume its sweep to queue it again)"]
    else:
        parts = [f"position {position} in {run.queue}" if position else f"queue {run.queue}"]
    gang = run.gang_members
    if run.nodes > 1 and gang and run.status == RunStatus.RUNNING:
        workers = ", ".join(m["worker"] for m in gang)
        parts.append(f"workers {workers} ({len(gang)}/{run.nodes} nodes x {run.gpus} ranks)")
    elif run.worker_host:
        devices = f" GPU {run.gpu_index}" if run.gpu_index else ""
        ranks = f" ({run.gpus} ranks)" if run.gpus > 1 else ""
        parts.append(f"worker {run.worker_host}{devices}{ranks}")
    parts.append(f"attempt {run.attempts}/{run.max_attempts}")
    eta = eta_seconds(run)
    if eta is not None:
        parts.append(f"ETA {eta:.0f} s")
    if run.cancel_requested and run.status == RunStatus.RUNNING:
        parts.append("cancelling…")
    elif run.paused and run.status == RunStatus.RUNNING:
        parts.append("pausing… (stops at a checkpoint)")
    return " · ".join(parts)


def served_queues() -> set[str]:
    """Queues at least one live worker (heartbeat within LIVE_WITHIN_S) consumes."""
    return {
        q for queues in Worker.live(LIVE_WITHIN_S).values_list("queues", flat=True) for q in queues
    }


def unserved_warning(queue: str) -> str | None:
    """The warning a submitter needs when no live worker serves ``queue``, else None."""
    if queue in served_queues():
        return None
    return f"No live worker serves {queue}; runs here wait until one starts."


def waiting_reason(run: Run) -> str | None:
    """Why a queued run cannot start now, for its page and the API: no live
    worker serves its queue, or none owns the ranks it asks for ("needs 8
    GPUs; the largest live worker on gpu-a100 has 4 GPUs"). None otherwise."""
    if run.status != RunStatus.QUEUED:
        return None
    if run.paused:
        return "paused with its sweep: no worker takes it until the sweep is resumed"
    workers = Worker.live_serving(run.queue, LIVE_WITHIN_S)
    if not workers:
        return unserved_warning(run.queue)
    largest = max(workers, key=lambda w: w.ranks_per_node)
    unit = "GPU" if largest.gpus else "rank"
    need = f"{run.gpus} {unit}" + ("s" if run.gpus != 1 else "")
    if largest.ranks_per_node < run.gpus:
        return (
            f"needs {need}; the largest live worker on {run.queue} has "
            f"{largest.capacity_text()}: it waits until a worker that owns {run.gpus} starts"
        )
    fitting = sum(1 for w in workers if w.ranks_per_node >= run.gpus)
    if fitting < run.nodes:
        return (
            f"needs {run.nodes} workers with {need} each at once; {fitting} live worker"
            f"{'s' if fitting != 1 else ''} on {run.queue} can take it"
        )
    return None
