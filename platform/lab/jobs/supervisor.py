"""Run one claimed run: spawn the trainer as a child process, watch it, and
record what its end means for the run.

The parts, one job each:

* ``lab/jobs/spawn.py``: the run folder prepared, the trainer's command line
  (trainer/launch.py for torchrun), the child process tied to the worker;
* ``lab/jobs/watch.py``: the loop while it trains: metrics streamed into the
  database in batches, warm-start progress, heartbeat and lease, cancel and
  worker shutdown passed on as SIGTERM;
* ``lab/jobs/outcome.py``: what the exit means: done, back to the queue, or
  interrupted and given back unspent (a worker's shutdown is never a cancel);
* ``lab/jobs/services.py``: the writes, each fenced by the attempt.

Every metric write is fenced by this attempt's number (trainer/run_folder/guard.py,
runs/metrics/ingest.py).
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

from django.conf import settings

from lab.assets.roots import check_config_paths
from lab.jobs import capacity, gang, outcome, spawn
from lab.jobs import services as job_services
from lab.jobs.childproc import kill_group
from lab.jobs.tailer import MetricsTail
from lab.jobs.watch import Supervision, ids, ingest, watch
from lab.jobs.worker_state import CURRENT_RUN
from lab.runs.metrics.ingest import StaleAttempt, drop_metrics_after
from lab.runs.models import Run, RunStatus
from trainer.errors import FieldError
from trainer.run_folder.files import METRICS_FILE

log = logging.getLogger("jobs")


def claim_for_wake_up(run_id: int, *, worker_host: str) -> job_services.Claim | None:
    """The run this wake-up (a message naming ``run_id``) should train: the best
    queued run of ``run_id``'s queue, which need not be ``run_id`` itself."""
    queue = Run.objects.filter(pk=run_id).values_list("queue", flat=True).first()
    if queue is None:
        log.info("run %s: no such run (deleted); skipping", run_id)
        return None
    owns = capacity.this_worker()
    joined = gang.join(queue, worker_host=worker_host, max_ranks_per_node=owns.ranks_per_node)
    if joined is not None:
        log.info("wake-up for run %s: joined run %s attempt %s as node %s", run_id, *joined)
        return job_services.Claim(*joined)
    claim = job_services.claim_next(
        queue,
        worker_host=worker_host,
        gpu_index=",".join(owns.devices),
        max_ranks_per_node=owns.ranks_per_node,
    )
    is_gang = claim is not None and Run.objects.filter(pk=claim.run_id, nodes__gt=1).exists()
    if is_gang and not gang.lead(claim.run_id, claim.attempt, worker_host):
        log.info("run %s: not enough live workers for its gang; back to the queue", claim.run_id)
        return None
    if claim is None:
        log.info("wake-up for run %s: no queued run left in %s; skipping", run_id, queue)
    elif claim.run_id != run_id:
        log.info("wake-up for run %s: claimed run %s, first in %s", run_id, claim.run_id, queue)
    return claim


def execute_claim(claim: job_services.Claim) -> str:
    """Train a claimed run (for logs and tests: what happened)."""
    CURRENT_RUN["id"] = claim.run_id
    try:
        return _supervise(claim)
    finally:
        CURRENT_RUN["id"] = None


def _supervise(claim: job_services.Claim) -> str:
    run = Run.objects.get(pk=claim.run_id)
    run_dir = Path(run.run_dir)
    sup = Supervision(claim=claim, run_dir=run_dir, tail=MetricsTail(run_dir / METRICS_FILE))
    try:
        # The files the trainer will open, checked again where it runs: the roots
        # may differ from the web server's, and a stored config predates them.
        check_config_paths(run.config or {})
    except FieldError as exc:
        return _fail_at_once(
            claim, f"invalid config: {exc} (run folder {run_dir})", field_errors=exc.as_dict()
        )
    if run.nodes > 1 and not sup.member:
        sup.gang_deadline = time.monotonic() + settings.LAB_GANG_TIMEOUT_S
    # A member finds the folder held by its own gang's leader: it never waits on it.
    if not sup.member and not spawn.wait_for_free_folder(sup):
        return "lost"
    try:
        log_path, cmd = spawn.prepare(run, sup)
        proc = spawn.start(cmd, log_path, sup, run.gpus)
    except OSError as exc:
        # An unwritable or missing run folder will not heal by retrying on
        # another worker: fail now, with the OS's own words on the run.
        return _fail_at_once(claim, f"cannot use the run folder {run_dir}: {exc}")
    try:
        returncode = watch(proc, sup)
    except BaseException:
        # The supervisor itself failed (e.g. the database went away): never leave
        # an unwatched trainer behind. The run keeps status running, its
        # heartbeat goes stale, and the reconciler requeues it to resume.
        kill_group(proc, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        if sup.lease is not None:  # the trainer is gone: its lease has no reader left
            sup.lease.unlink(missing_ok=True)

    if sup.reason == "lost":
        return "lost"
    if run.gpus * run.nodes > 1:
        returncode = outcome.ranks_exit_code(run_dir, returncode)
    if sup.member:
        return outcome.member_exit(claim, sup, returncode, log_path)
    if not _final_pass(sup):
        return "lost"
    return _record(run, sup, returncode, log_path)


def _fail_at_once(
    claim: job_services.Claim, error: str, field_errors: dict[str, list[str]] | None = None
) -> str:
    log.error("run %s attempt %s: %s", *ids(claim), error)
    job_services.finish_run(
        claim, status=RunStatus.FAILED, summary=None, error=error, field_errors=field_errors
    )
    return RunStatus.FAILED


def _final_pass(sup: Supervision) -> bool:
    """Read the whole metrics file once more: the DB ends equal to the trainer's
    record, including steps a resumed trainer rewound and rewrote. False when
    this attempt lost the run meanwhile."""
    try:
        records = sup.tail.read_all()
        ingest(sup, records)
        file_steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
        if file_steps:
            drop_metrics_after(sup.claim.run_id, max(file_steps), attempt=sup.claim.attempt)
            sup.last_step = max(file_steps)
    except StaleAttempt:
        log.warning("run %s attempt %s lost the run before its final pass", *ids(sup.claim))
        return False
    return True


def _record(run: Run, sup: Supervision, returncode: int, log_path: Path) -> str:
    """The leader's (or a lone worker's) record of the attempt's end."""
    claim = sup.claim
    cause = outcome.stop_cause(sup, returncode)
    if cause == "shutdown":
        outcome.give_back(claim, sup, "the worker shut down", log_path)
        return "requeued"
    if cause == "pause":
        outcome.give_back(claim, sup, "its sweep was paused (held until it is resumed)", log_path)
        return "paused"
    if returncode in outcome.RETRY_REASONS:
        return outcome.retry_later(claim, sup, outcome.RETRY_REASONS[returncode], log_path)
    if run.nodes > 1:
        gang_outcome = outcome.gang_leader_exit(claim, sup, returncode, log_path, cause)
        if gang_outcome is not None:
            return gang_outcome
    if cause == "interrupted":
        why = "the trainer was stopped by a signal its worker did not send (the worker stays up)"
        outcome.append_to_log(log_path, f"=== attempt {claim.attempt} interrupted: {why}")
        return outcome.retry_later(claim, sup, f"interrupted: {why}", log_path)
    status, summary, error = outcome.outcome(
        returncode, sup.run_dir, log_path, cancelled=cause == "cancel"
    )
    field_errors = (
        outcome.config_field_errors(sup.run_dir, returncode) if status == RunStatus.FAILED else None
    )
    job_services.finish_run(
        claim,
        status=status,
        summary=summary,
        error=error,
        current_step=sup.steps_done,
        field_errors=field_errors,
    )
    log.info("run %s attempt %s: %s (exit %s)", *ids(claim), status, returncode)
    return status
