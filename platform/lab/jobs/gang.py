"""Gang scheduling of runs over several workers (``run.nodes > 1``).

torchrun does the distributed part: every member worker starts
``torch.distributed.run --nnodes N --rdzv-backend c10d --rdzv-endpoint
HOST:PORT --rdzv-id run<pk>-a<attempt>`` (``rendezvous`` below; the command
line is trainer/launch.py's) and torchrun's c10d rendezvous joins them (the
leader's agent hosts the store at the endpoint). The queue only decides who
the members are:

1. A wake-up claims the run as usual (``claim_next``): that worker leads
   (node 0). ``lead`` records the gang and the endpoint for this attempt and
   sends ``nodes - 1`` more wake-ups to the run's queue.
2. A wake-up first looks for a gang of its queue still missing members that
   fits it (``join``) and joins it; only then does it claim a queued run.
3. The leader gives the gang ``LAB_GANG_TIMEOUT_S`` to assemble; otherwise
   ``release`` puts the run back in the queue (the attempt is not counted),
   and every member, whose heartbeat now fails, kills its trainer.
4. Once assembled, the leader ingests the metrics and records the outcome,
   as for a one-worker run. A member that dies takes its ranks with it; the
   others fail at the collective timeout (parallel.timeout_s); the first
   supervisor that sees a member's trainer fail puts the run back in the
   queue, and the next gang resumes from the last checkpoint. Metric steps
   are upserted by (run, step) and trimmed to the file on the final pass, so
   every step is stored once.

Membership is per attempt (each member row carries the attempt it joined),
so a gang of an earlier attempt is never joined.
"""

from __future__ import annotations

import logging
import socket

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from lab.jobs.models import Worker
from lab.runs.dispatch import new_task_id, send_run_on_commit
from lab.runs.models import Run, RunStatus
from lab.runs.queue_order import in_queue_order
from trainer.launch import Rendezvous

log = logging.getLogger("jobs")


def fitting_live_workers(run: Run) -> int:
    """Live workers serving the run's queue that own at least ``run.gpus`` ranks."""
    from lab.jobs.health import LIVE_WITHIN_S

    return sum(
        1 for w in Worker.live_serving(run.queue, LIVE_WITHIN_S) if w.ranks_per_node >= run.gpus
    )


def free_port() -> int:
    """A port of LAB_RDZV_PORTS ("first-last") nobody listens on here: the
    rendezvous store's. The range is what a firewall between hosts must open."""
    first, last = (int(p) for p in settings.LAB_RDZV_PORTS.split("-"))
    for port in range(first, last + 1):
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in LAB_RDZV_PORTS={settings.LAB_RDZV_PORTS}")


def lead(run_id: int, attempt: int, worker_host: str) -> bool:
    """Node 0 of a fresh attempt: record the gang and the rendezvous endpoint,
    wake ``nodes - 1`` more workers. False when the attempt is no longer current,
    or when fewer live workers than nodes could ever join (the claim is then
    undone without spending the attempt: the allowance grows by one, and the
    reconciler re-sends the wake-up later)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.status != RunStatus.RUNNING or run.attempts != attempt:
            return False
        if fitting_live_workers(run) < run.nodes:
            Run.objects.filter(pk=run_id, attempts=attempt).update(
                status=RunStatus.QUEUED,
                max_attempts=F("max_attempts") + 1,  # not spent: the fencing token stays unique
                worker_host="",
                published_at=None,  # the reconciler's next pass re-sends its wake-up
                error=f"needs {run.nodes} workers at once; fewer are live",
            )
            return False
        run.gang = [{"worker": worker_host, "node": 0, "attempt": attempt}]
        run.rdzv_endpoint = f"{settings.LAB_RDZV_HOST}:{free_port()}"
        run.save(update_fields=["gang", "rdzv_endpoint"])
        for _ in range(run.nodes - 1):
            send_run_on_commit(run.pk, run.queue, run.priority, new_task_id())
    log.info(
        "run %s attempt %s: leading a gang of %s at %s",
        run_id,
        attempt,
        run.nodes,
        run.rdzv_endpoint,
    )
    return True


def join(queue: str, *, worker_host: str, max_ranks_per_node: int) -> tuple[int, int, int] | None:
    """Join the oldest gang of ``queue`` still missing members that fits this
    worker: (run id, attempt, node), or None. Row locks (SKIP LOCKED on
    PostgreSQL, IMMEDIATE transactions on SQLite) make two joiners take
    different nodes."""
    with transaction.atomic():
        assembling = in_queue_order(
            Run.objects.select_for_update(skip_locked=True).filter(
                queue=queue, status=RunStatus.RUNNING, nodes__gt=1, gpus__lte=max_ranks_per_node
            )
        )
        for run in assembling:
            gang = run.gang_members
            if not gang or len(gang) >= run.nodes:
                continue
            if any(m["worker"] == worker_host for m in gang):
                continue
            node = len(gang)
            run.gang = [*gang, {"worker": worker_host, "node": node, "attempt": run.attempts}]
            run.save(update_fields=["gang"])
            return run.pk, run.attempts, node
    return None


def assembled(run_id: int, attempt: int) -> bool:
    run = Run.objects.only("gang", "attempts", "nodes").get(pk=run_id)
    return run.attempts == attempt and len(run.gang_members) >= run.nodes


def release(run_id: int, attempt: int, reason: str) -> bool:
    """The gang did not assemble in time: back to the queue, the attempt not
    counted against max_attempts; False when the attempt had already lost the run."""
    task_id = new_task_id()
    with transaction.atomic():
        run = Run.objects.only("queue", "priority").get(pk=run_id)
        released = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, attempts=attempt).update(
            status=RunStatus.QUEUED,
            max_attempts=F("max_attempts") + 1,
            gang=[],
            task_id=task_id,
            worker_host="",
            published_at=timezone.now(),
            error=f"attempt {attempt}: {reason}; requeued",
        )
        if released:
            send_run_on_commit(run_id, run.queue, run.priority, task_id)
    return bool(released)


def rendezvous(run: Run, timeout_s: float) -> Rendezvous:
    """The c10d rendezvous of the run's current gang, the same on every member
    (trainer/launch.py builds each member's torchrun command from it)."""
    return Rendezvous(
        nnodes=run.nodes,
        endpoint=run.rdzv_endpoint,
        run_id=f"run{run.pk}-a{run.attempts}",
        join_timeout_s=timeout_s,
    )
