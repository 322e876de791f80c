"""Watch one attempt's trainer until it exits: tail and store its metrics,
record its warm-start progress, heartbeat and renew its lease, and stop it
when the run is cancelled or paused, this worker shuts down or the attempt
lost the run.

A stop is cooperative: SIGTERM, the trainer finishes its step (or its warm
start's step), saves what it has and exits; SIGKILL only after
``LAB_TERM_GRACE_S``, or at once when another attempt owns the run.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from lab.jobs import gang
from lab.jobs import services as job_services
from lab.jobs.childproc import kill_group
from lab.jobs.progress import poll_progress
from lab.jobs.tailer import MetricsTail
from lab.jobs.worker_state import SHUTDOWN
from lab.runs.metrics.columns import chunk_of
from lab.runs.metrics.ingest import StaleAttempt, ingest_metrics
from lab.runs.metrics.seal import seal_metrics
from trainer.run_folder.guard import renew_lease

log = logging.getLogger("jobs")
# The connection-level errors: the database is away or ended this session. Other
# database errors (bad data, a constraint) are bugs and propagate as before.
UNREACHABLE = (OperationalError, InterfaceError)


@dataclass
class Supervision:
    """Mutable state of one attempt's loop."""

    claim: job_services.Claim
    run_dir: Path
    tail: MetricsTail
    last_step: int = -1
    term_sent_at: float | None = None
    # Why this supervisor stopped the trainer: "cancel" | "pause" | "shutdown" | "lost"
    # ("": it did not)
    reason: str = ""
    lease: Path | None = None  # renewed after every heartbeat this attempt wins
    # Metric lines read from the file but not yet stored (the database refused
    # them with an error: they are stored on the next pass that reaches it).
    pending: list[dict[str, Any]] = field(default_factory=list)
    db_error_logged_at: float = float("-inf")
    sealed_chunks: int = 0  # the run's leading chunks of metrics kept as columns
    # progress.json's mtime last recorded; starts at the attempt's start, so a
    # previous attempt's file is never read (lab/jobs/progress.py)
    progress_mtime: float = field(default_factory=time.time)
    # A gang's leader: when the members must have joined (monotonic); None once
    # they have, or for a one-worker run (lab/jobs/gang.py).
    gang_deadline: float | None = None

    @property
    def member(self) -> bool:
        """A gang member other than the leader: it trains, the leader keeps the record."""
        return self.claim.node > 0

    @property
    def steps_done(self) -> int:
        return self.last_step + 1


def ids(claim: job_services.Claim) -> tuple[int, int]:
    return claim.run_id, claim.attempt


def ingest(sup: Supervision, records: list[dict[str, Any]]) -> None:
    """Store metric lines in batches, fenced by the attempt (``StaleAttempt``
    when it lost the run), and seal the chunks training has moved past."""
    batch = settings.LAB_METRICS_BATCH
    for i in range(0, len(records), batch):
        ingest_metrics(sup.claim.run_id, records[i : i + batch], attempt=sup.claim.attempt)
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    if steps:
        sup.last_step = max(sup.last_step, *steps)
        if chunk_of(max(steps)) > sup.sealed_chunks:
            # Training moved into a new chunk: the ones before it are settled.
            # Keeping them as columns keeps live comparisons' row reads short.
            sup.sealed_chunks = seal_metrics(sup.claim.run_id)


def watch(proc: subprocess.Popen, sup: Supervision) -> int:
    """Poll loop until the trainer exits; returns its exit code."""
    poll_s = settings.LAB_POLL_S
    heartbeat_s = settings.LAB_HEARTBEAT_S
    cancel_check_s = min(1.0, heartbeat_s)
    last_beat = last_cancel_check = 0.0
    while True:
        returncode = proc.poll()
        if not sup.member:  # the leader keeps the record
            sup.pending.extend(sup.tail.read_new())
        if sup.pending:
            try:
                ingest(sup, sup.pending)
                sup.pending = []
            except StaleAttempt:
                log.warning("run %s attempt %s: metrics refused, run lost", *ids(sup.claim))
                return _kill(proc, sup)
            except UNREACHABLE as exc:
                database_error(sup, exc)
        if not sup.member:
            sup.progress_mtime = poll_progress(
                sup.run_dir, sup.claim.run_id, sup.claim.attempt, sup.progress_mtime
            )
        if returncode is not None:
            return returncode
        now = time.monotonic()
        if sup.gang_deadline is not None and now > sup.gang_deadline:
            if not gang.assembled(sup.claim.run_id, sup.claim.attempt):
                log.warning("run %s attempt %s: gang did not assemble; released", *ids(sup.claim))
                gang.release(sup.claim.run_id, sup.claim.attempt, "the gang did not assemble")
                return _kill(proc, sup)
            sup.gang_deadline = None
        if now - last_beat >= heartbeat_s:
            last_beat = now
            try:
                owned = job_services.heartbeat(
                    sup.claim, sup.steps_done if sup.last_step >= 0 else None
                )
            except UNREACHABLE as exc:
                database_error(sup, exc)
                owned = None  # unknown: keep training, but do not renew the lease
            if owned is False:
                # The reconciler gave this run to another attempt: stop at once.
                log.warning("run %s attempt %s lost ownership; killing trainer", *ids(sup.claim))
                return _kill(proc, sup)
            if owned and sup.lease is not None:
                renew_lease(sup.lease)  # only an attempt that still owns the run renews
        if sup.term_sent_at is not None and now - sup.term_sent_at > settings.LAB_TERM_GRACE_S:
            log.warning(
                "run %s: trainer ignored SIGTERM for %.0f s; killing it",
                sup.claim.run_id,
                settings.LAB_TERM_GRACE_S,
            )
            kill_group(proc, signal.SIGKILL)
            return proc.wait()
        if sup.term_sent_at is None and now - last_cancel_check >= cancel_check_s:
            last_cancel_check = now
            if SHUTDOWN.is_set():
                sup.reason = "shutdown"
            else:
                sup.reason = _stop_requested(sup)
            if sup.reason:
                # Cooperative stop: the trainer finishes its step, checkpoints, exits.
                proc.send_signal(signal.SIGTERM)
                sup.term_sent_at = now
        time.sleep(poll_s)


def _kill(proc: subprocess.Popen, sup: Supervision) -> int:
    """This attempt lost the run: the trainer must not write another line."""
    sup.reason = "lost"
    kill_group(proc, signal.SIGKILL)
    return proc.wait()


def database_error(sup: Supervision, exc: Exception) -> None:
    """The database did not answer (restarted, or it ended this worker's session,
    e.g. PostgreSQL's idle-in-transaction timeout after the worker was frozen).
    Drop the broken connection, so the next pass opens a new one, and carry on:
    metric lines wait in ``sup.pending``, and the lease is not renewed, so a
    trainer whose worker cannot reach the database for LAB_LEASE_S stops itself
    and the reconciler hands the run on. Logged at most every 30 s."""
    connection.close()
    now = time.monotonic()
    if now - sup.db_error_logged_at >= 30.0:
        sup.db_error_logged_at = now
        log.warning(
            "run %s attempt %s: database unreachable (%s); retrying",
            *ids(sup.claim),
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
        )


def _stop_requested(sup: Supervision) -> str:
    """ "cancel", "pause" or "" (an unreachable database asks nothing)."""
    try:
        return job_services.stop_requested(sup.claim)
    except UNREACHABLE as exc:
        database_error(sup, exc)
        return ""
