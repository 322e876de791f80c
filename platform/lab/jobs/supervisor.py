"""Run one claimed run: spawn the trainer as a child process, stream its
metrics into the DB in batches, heartbeat, honour cancel, record the outcome.

Why a child process (docs/design.md, "data flow"): GPU memory is released
when the run ends, a crashing run cannot take the worker down, torchrun works
unchanged for several GPUs, and the trainer stays usable without Django.

The child is tied to the worker's life (Linux PR_SET_PDEATHSIG): when the
worker is killed, the trainer dies with it. A worker that is frozen rather
than killed (SIGSTOP, a stuck host) stops renewing the child's lease file, and
the child stops within ``LAB_LEASE_S``, before the reconciler hands the run to
another attempt (``LAB_STALE_AFTER_S``). The child holds the run folder's OS
lock, so a second trainer can never write the same folder, and every metric
write is fenced by this attempt's number (trainer/run_guard.py,
runs/metrics/ingest.py).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from lab.assets.roots import check_config_paths
from lab.jobs import capacity, gang
from lab.jobs import services as job_services
from lab.jobs.childproc import kill_group, tied_to_this_process
from lab.jobs.progress import poll_progress
from lab.jobs.tailer import MetricsTail
from lab.runs.dispatch import new_task_id, send_run_on_commit
from lab.runs.metrics.columns import chunk_of
from lab.runs.metrics.ingest import StaleAttempt, drop_metrics_after, ingest_metrics
from lab.runs.metrics.seal import seal_metrics
from lab.runs.models import Run, RunStatus
from trainer.checkpoint import checkpoint_path
from trainer.errors import BAD_INPUT_EXIT_CODE, FieldError
from trainer.run_files import (
    CONFIG_FILE,
    EXIT_CODE_FILE,
    LOG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
)
from trainer.run_guard import (
    LEASE_EXPIRED_EXIT_CODE,
    RUN_DIR_BUSY_EXIT_CODE,
    renew_lease,
    run_dir_is_locked,
)

log = logging.getLogger("jobs")
# The connection-level errors: the database is away or ended this session. Other
# database errors (bad data, a constraint) are bugs and propagate as before.
UNREACHABLE = (OperationalError, InterfaceError)

REPO_ROOT = Path(settings.BASE_DIR)

LOG_TAIL_CHARS = 4000

# Set by the worker's shutdown signal (jobs.signals): stop the trainer
# gracefully (it checkpoints) and give the run back to the queue.
SHUTDOWN = threading.Event()
# The run this worker process is training (read by the registry heartbeat).
CURRENT_RUN: dict[str, int | None] = {"id": None}


def lease_file(run_dir: Path, attempt: int) -> Path:
    """The attempt's lease: one file per attempt, so a later attempt's renewals
    can never keep an earlier attempt's trainer alive."""
    return run_dir / f".lease-attempt-{attempt}"


def trainer_command(
    config_path: Path,
    run_dir: Path,
    *,
    resume: bool,
    gpus: int,
    lease: Path | None = None,
    lease_s: float = 0.0,
    gang_args: list[str] | None = None,
) -> list[str]:
    """``python -m trainer run --config ... --out ... [--resume] [--lease-file ... --lease-s ...]``
    (torchrun for several GPUs; with ``gang_args``, torchrun as one node of a gang)."""
    args = ["-m", "trainer", "run", "--config", str(config_path), "--out", str(run_dir)]
    if resume:
        args.append("--resume")
    if lease is not None:
        args += ["--lease-file", str(lease), "--lease-s", f"{lease_s:g}"]
    if gang_args:
        return [sys.executable, "-m", "torch.distributed.run", *gang_args, *args]
    if gpus > 1:
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
        return [sys.executable, *launcher, *args]
    return [sys.executable, *args]


def has_checkpoint(run_dir: Path) -> bool:
    # last.pt only: a temporary a killed trainer left behind is no checkpoint.
    return checkpoint_path(run_dir).exists()


def _log_tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - LOG_TAIL_CHARS))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


@dataclass
class Supervision:
    """Mutable state of one attempt's loop."""

    claim: job_services.Claim
    run_dir: Path
    tail: MetricsTail
    last_step: int = -1
    term_sent_at: float | None = None
    reason: str = ""  # "cancel" | "shutdown" | "lost"
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


def _ingest(sup: Supervision, records: list[dict[str, Any]]) -> None:
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


def claim_for_wake_up(run_id: int, *, worker_host: str) -> job_services.Claim | None:
    """The run this wake-up (a message naming ``run_id``) should train: the best
    queued run of ``run_id``'s queue, which need not be ``run_id`` itself."""
    queue = Run.objects.filter(pk=run_id).values_list("queue", flat=True).first()
    if queue is None:
        log.info("run %s: no such run (deleted); skipping", run_id)
        return None
    owns = capacity.this_worker()
    joined = gang.join(queue, worker_host=worker_host, max_ranks=owns.ranks)
    if joined is not None:
        log.info("wake-up for run %s: joined run %s attempt %s as node %s", run_id, *joined)
        return job_services.Claim(*joined)
    claim = job_services.claim_next(
        queue, worker_host=worker_host, gpu_index=",".join(owns.devices), max_ranks=owns.ranks
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
        error = f"invalid config: {exc} (run folder {run_dir})"
        log.error("run %s attempt %s: %s", claim.run_id, claim.attempt, error)
        job_services.finish_run(claim, status=RunStatus.FAILED, summary=None, error=error)
        return RunStatus.FAILED
    if run.nodes > 1 and not sup.member:
        sup.gang_deadline = time.monotonic() + settings.LAB_GANG_TIMEOUT_S
    # A member finds the folder held by its own gang's leader: it never waits on it.
    if not sup.member and not _wait_for_free_folder(sup):
        return "lost"
    try:
        log_path, cmd = _prepare(run, sup)
        log.info("run %s attempt %s: %s", claim.run_id, claim.attempt, " ".join(cmd))
        with open(log_path, "ab") as log_fh:
            log_fh.write(f"\n=== attempt {claim.attempt}: {' '.join(cmd)}\n".encode())
            log_fh.flush()
            proc = subprocess.Popen(
                tied_to_this_process(cmd),
                cwd=REPO_ROOT,
                env=_trainer_env(run.gpus),
                stdin=subprocess.DEVNULL,
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C reaches the worker only
            )
    except OSError as exc:
        # An unwritable or missing run folder will not heal by retrying on
        # another worker: fail now, with the OS's own words on the run.
        error = f"cannot use the run folder {run_dir}: {exc}"
        log.error("run %s attempt %s: %s", claim.run_id, claim.attempt, error)
        job_services.finish_run(claim, status=RunStatus.FAILED, summary=None, error=error)
        return RunStatus.FAILED
    try:
        returncode = _watch(proc, sup)
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
        returncode = ranks_exit_code(run_dir, returncode)
    if sup.member:
        return _member_exit(claim, sup, returncode, log_path)
    # Final pass over the whole file: the DB ends equal to the trainer's record,
    # including steps a resumed trainer rewound and rewrote.
    try:
        records = sup.tail.read_all()
        _ingest(sup, records)
        file_steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
        if file_steps:
            drop_metrics_after(claim.run_id, max(file_steps), attempt=claim.attempt)
            sup.last_step = max(file_steps)
    except StaleAttempt:
        log.warning("run %s attempt %s lost the run before its final pass", *_ids(claim))
        return "lost"

    if sup.reason == "shutdown":
        _give_back(claim, sup)
        return "requeued"
    if returncode in (RUN_DIR_BUSY_EXIT_CODE, LEASE_EXPIRED_EXIT_CODE):
        return _retry_later(claim, sup, _RETRY_REASONS[returncode], log_path)
    if run.nodes > 1:
        gang_outcome = _gang_leader_exit(claim, sup, returncode, log_path)
        if gang_outcome is not None:
            return gang_outcome
    status, summary, error = outcome(
        returncode, run_dir, log_path, cancelled=sup.reason == "cancel"
    )
    job_services.finish_run(
        claim, status=status, summary=summary, error=error, current_step=sup.steps_done
    )
    log.info("run %s attempt %s: %s (exit %s)", claim.run_id, claim.attempt, status, returncode)
    return status


def _ids(claim: job_services.Claim) -> tuple[int, int]:
    return claim.run_id, claim.attempt


def _prepare(run: Run, sup: Supervision) -> tuple[Path, list[str]]:
    """Write the run folder's config, drop a previous attempt's summary, renew the
    lease, build the trainer command: (log path, command). OSError
    when the folder cannot be written. A gang member writes its own config
    copy and log (``config.node<k>.json``, ``trainer.node<k>.log``) and leaves
    the summary to its leader."""
    run_dir = sup.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    node = sup.claim.node
    config_path = run_dir / (f"config.node{node}.json" if sup.member else CONFIG_FILE)
    config_path.write_text(json.dumps(run.config, indent=2, sort_keys=True))
    if not sup.member:
        (run_dir / SUMMARY_FILE).unlink(missing_ok=True)  # never read a previous attempt's
        (run_dir / EXIT_CODE_FILE).unlink(missing_ok=True)
    sup.lease = lease_file(run_dir, sup.claim.attempt)
    renew_lease(sup.lease)
    cmd = trainer_command(
        config_path,
        run_dir,
        resume=has_checkpoint(run_dir),
        gpus=run.gpus,
        lease=sup.lease,
        lease_s=settings.LAB_LEASE_S,
        gang_args=gang.torchrun_args(run, settings.LAB_GANG_TIMEOUT_S) if run.nodes > 1 else None,
    )
    return run_dir / (f"trainer.node{node}.log" if sup.member else LOG_FILE), cmd


def _trainer_env(ranks: int) -> dict[str, str]:
    """The trainer's environment: a GPU worker that owns more devices than the
    run needs shows it only the first ``ranks`` of them."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    devices = capacity.this_worker().visible_devices(ranks)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return env


def _wait_for_free_folder(sup: Supervision) -> bool:
    """Wait (heartbeating) while an earlier attempt's trainer still holds the run
    folder: a frozen one stops once its lease expires, a killed one at once.
    False when this attempt lost the run meanwhile. After the wait the trainer
    is started anyway: if the folder is still held it exits with
    RUN_DIR_BUSY_EXIT_CODE and the run goes back to the queue."""
    deadline = time.monotonic() + 2 * settings.LAB_STALE_AFTER_S
    waited = False
    while run_dir_is_locked(sup.run_dir) and time.monotonic() < deadline:
        if not waited:
            log.warning("run %s attempt %s: run folder still held; waiting", *_ids(sup.claim))
            waited = True
        if not job_services.heartbeat(sup.claim):
            return False
        time.sleep(settings.LAB_POLL_S)
    return True


_RETRY_REASONS = {
    RUN_DIR_BUSY_EXIT_CODE: "the run folder is held by another trainer",
    LEASE_EXPIRED_EXIT_CODE: "the trainer's lease expired (its worker did not renew it in time)",
}


def ranks_exit_code(run_dir: Path, returncode: int) -> int:
    """torchrun exits 1 for any failed rank; a rank that ended with a code the
    platform acts on (bad config, folder busy, lease expired) left it in the run
    folder (trainer.cli.report_exit_code)."""
    if returncode == 0:
        return 0
    try:
        return int((run_dir / EXIT_CODE_FILE).read_text())
    except (OSError, ValueError):
        return returncode


def _member_exit(claim: job_services.Claim, sup: Supervision, returncode: int, log_path) -> str:
    """A gang member's trainer ended. The leader records a run that ended well;
    a member whose ranks failed sends the whole run back to resume on a new gang
    (the leader's heartbeat then fails and it stops its own ranks)."""
    if sup.reason in ("cancel", "shutdown") or returncode in (0, BAD_INPUT_EXIT_CODE):
        return f"node {claim.node} done"  # the leader records the outcome (a bad config too)
    reason = f"node {claim.node}'s ranks failed (exit {returncode})"
    return _retry_later(claim, sup, reason, log_path)


def _gang_leader_exit(
    claim: job_services.Claim, sup: Supervision, returncode: int, log_path
) -> str | None:
    """The leader's view of a gang that ended badly, or None to record the outcome
    as usual. A member's worker that shut down stops every rank (they agree to stop
    after the step), which is no cancel: the run goes back to the queue unspent.
    Ranks that failed (a member lost: its peers see the connection reset or a
    collective time out) send the run back to resume from its checkpoint on a new
    gang; a failure that repeats ends the run once its attempts are spent. A bad
    config is refused before any rank trains (exit BAD_INPUT_EXIT_CODE): it fails
    at once as for a one-worker run."""
    summary = read_summary(sup.run_dir)
    status = (summary or {}).get("status")
    stopped_elsewhere = status == RunStatus.CANCELLED and sup.reason != "cancel"
    if stopped_elsewhere and not job_services.cancel_requested(claim):
        _give_back(claim, sup)
        return "requeued"
    failed = status == RunStatus.FAILED or (summary is None and returncode != 0)
    if failed and returncode != BAD_INPUT_EXIT_CODE and sup.reason == "":
        why = (summary or {}).get("error", "").strip().splitlines()[-1:] or [f"exit {returncode}"]
        return _retry_later(claim, sup, f"the gang's ranks failed ({why[0][:300]})", log_path)
    return None


def _retry_later(claim: job_services.Claim, sup: Supervision, reason: str, log_path) -> str:
    """The trainer found the folder held by another trainer, outlived its lease
    while this worker was too slow to renew it, or a gang lost a member: the run
    goes back to the queue (the attempt is spent), or fails once attempts run
    out, with the reason."""
    run = Run.objects.get(pk=claim.run_id)
    if claim.attempt >= run.max_attempts:
        error = f"{reason}, {claim.attempt} times\n{_log_tail(log_path)}"
        job_services.finish_run(
            claim, status=RunStatus.FAILED, summary=None, error=error,
            current_step=sup.steps_done,
        )  # fmt: skip
        return RunStatus.FAILED
    task_id = new_task_id()
    with transaction.atomic():
        if Run.objects.filter(
            pk=claim.run_id, status=RunStatus.RUNNING, attempts=claim.attempt
        ).update(
            status=RunStatus.QUEUED,
            task_id=task_id,
            worker_host="",
            published_at=timezone.now(),
            current_step=sup.steps_done,
            error=f"attempt {claim.attempt}: {reason}; requeued",
        ):
            send_run_on_commit(run.pk, run.queue, run.priority, task_id)
    log.warning("run %s attempt %s: %s; requeued", claim.run_id, claim.attempt, reason)
    return "requeued"


def _watch(proc: subprocess.Popen, sup: Supervision) -> int:
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
                _ingest(sup, sup.pending)
                sup.pending = []
            except StaleAttempt:
                log.warning("run %s attempt %s: metrics refused, run lost", *_ids(sup.claim))
                sup.reason = "lost"
                kill_group(proc, signal.SIGKILL)
                return proc.wait()
            except UNREACHABLE as exc:
                _database_error(sup, exc)
        if not sup.member:
            sup.progress_mtime = poll_progress(
                sup.run_dir, sup.claim.run_id, sup.claim.attempt, sup.progress_mtime
            )
        if returncode is not None:
            return returncode
        now = time.monotonic()
        if sup.gang_deadline is not None and now > sup.gang_deadline:
            if not gang.assembled(sup.claim.run_id, sup.claim.attempt):
                log.warning("run %s attempt %s: gang did not assemble; released", *_ids(sup.claim))
                gang.release(sup.claim.run_id, sup.claim.attempt, "the gang did not assemble")
                sup.reason = "lost"
                kill_group(proc, signal.SIGKILL)
                return proc.wait()
            sup.gang_deadline = None
        if now - last_beat >= heartbeat_s:
            last_beat = now
            try:
                owned = job_services.heartbeat(
                    sup.claim, sup.steps_done if sup.last_step >= 0 else None
                )
            except UNREACHABLE as exc:
                _database_error(sup, exc)
                owned = None  # unknown: keep training, but do not renew the lease
            if owned is False:
                # The reconciler gave this run to another attempt: stop at once.
                log.warning(
                    "run %s attempt %s lost ownership; killing trainer",
                    sup.claim.run_id,
                    sup.claim.attempt,
                )
                sup.reason = "lost"
                kill_group(proc, signal.SIGKILL)
                return proc.wait()
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
            elif _cancel_requested(sup):
                sup.reason = "cancel"
            if sup.reason:
                # Cooperative stop: the trainer finishes its step, checkpoints, exits.
                proc.send_signal(signal.SIGTERM)
                sup.term_sent_at = now
        time.sleep(poll_s)


def _database_error(sup: Supervision, exc: Exception) -> None:
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
            *_ids(sup.claim),
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
        )


def _cancel_requested(sup: Supervision) -> bool:
    try:
        return job_services.cancel_requested(sup.claim)
    except UNREACHABLE as exc:
        _database_error(sup, exc)
        return False


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The trainer's summary.json, or None when it wrote none (or half of one)."""
    try:
        return json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def outcome(
    returncode: int, run_dir: Path, log_path: Path, *, cancelled: bool
) -> tuple[str, dict[str, Any] | None, str]:
    """(status, summary, error) from the exit code and the trainer's summary file."""
    summary = read_summary(run_dir)
    if summary is not None and summary.get("status") in RunStatus.values:
        status = summary["status"]
        error = "" if status != RunStatus.FAILED else _log_tail(log_path)
        return status, summary, error
    if returncode == BAD_INPUT_EXIT_CODE:
        return (
            RunStatus.FAILED,
            summary,
            f"invalid config ({run_dir / CONFIG_FILE}; log {log_path}):\n" + _log_tail(log_path),
        )
    if cancelled:
        return RunStatus.CANCELLED, summary, ""
    if returncode == 0:
        return RunStatus.SUCCEEDED, summary, ""
    return (
        RunStatus.FAILED,
        summary,
        f"trainer exited with code {returncode} (log {log_path})\n{_log_tail(log_path)}",
    )


def _give_back(claim: job_services.Claim, sup: Supervision) -> None:
    """The worker is shutting down: put the run back in the queue without
    spending an attempt; the next worker resumes from the checkpoint just written.

    ``attempts`` is the fencing token and never goes back (a late write of this
    attempt must stay fenced out once the next claim takes ``attempts + 1``):
    the allowance grows by one instead."""
    run = Run.objects.get(pk=claim.run_id)
    task_id = new_task_id()
    with transaction.atomic():
        given = Run.objects.filter(
            pk=claim.run_id, status=RunStatus.RUNNING, attempts=claim.attempt
        ).update(
            status=RunStatus.QUEUED,
            max_attempts=F("max_attempts") + 1,
            task_id=task_id,
            worker_host="",
            published_at=timezone.now(),
            current_step=sup.steps_done,
            error="worker shut down; requeued to resume from its checkpoint",
        )
        if given:
            send_run_on_commit(run.pk, run.queue, run.priority, task_id)
