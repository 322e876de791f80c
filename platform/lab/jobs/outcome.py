"""What an attempt's ended trainer means for its run: done (succeeded, failed,
cancelled), back to the queue for another attempt, or given back unspent.

A stop is told apart by who asked for it, never by what the trainer says: the
trainer stops the same way on any SIGTERM or SIGINT (it finishes its step,
saves its state and reports ``cancelled``), and cannot know why it got one.

* **cancel**: the user asked (``Run.cancel_requested``): the run ends cancelled.
* **pause**: its sweep was paused (``Run.paused``, lab/runs/bulk.py): the run
  goes back to the queue, held, its attempt given back; resuming the sweep
  lets a worker claim it again, and that attempt resumes from the checkpoint.
* **shutdown**: this worker is shutting down (``worker_state.SHUTDOWN``: SIGTERM
  or Ctrl-C to the worker, ``make up`` stopping, ``docker stop``), whether this
  supervisor passed the stop on or the signal reached the trainer directly
  (a process group or cgroup stopped at once). The run is *interrupted*: it
  goes back to the queue without spending an attempt and the next claim
  (attempt + 1) resumes it from its checkpoint, or its warm start from the
  state the warm start saved (trainer/run/warmstart.py).
* **interrupted** from outside (a signal to the trainer alone, no cancel, the
  worker staying up): back to the queue as well, spending the attempt, so a
  stop that repeats ends the run once its attempts are spent.
"""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import Any

from lab.jobs import services as job_services
from lab.jobs.spawn import has_checkpoint
from lab.jobs.watch import Supervision, ids
from lab.jobs.worker_state import SHUTDOWN
from lab.runs.models import Run, RunStatus
from trainer.errors import BAD_INPUT_EXIT_CODE, FieldError
from trainer.run_folder.files import (
    CONFIG_FILE,
    EXIT_CODE_FILE,
    SUMMARY_FILE,
    read_field_errors,
)
from trainer.run_folder.guard import LEASE_EXPIRED_EXIT_CODE, RUN_DIR_BUSY_EXIT_CODE

log = logging.getLogger("jobs")

LOG_TAIL_CHARS = 4000

RETRY_REASONS = {
    RUN_DIR_BUSY_EXIT_CODE: "the run folder is held by another trainer",
    LEASE_EXPIRED_EXIT_CODE: "the trainer's lease expired (its worker did not renew it in time)",
}
# A trainer killed by a stop signal before it could handle it (still starting up).
STOP_SIGNAL_EXITS = frozenset(-s for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))


def log_tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - LOG_TAIL_CHARS))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The trainer's summary.json, or None when it wrote none (or half of one)."""
    try:
        return json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


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


def stop_cause(sup: Supervision, returncode: int) -> str:
    """Why the trainer stopped before its end: "cancel", "pause", "shutdown",
    "interrupted" (see the module docstring), or "" when it ended on its own."""
    if sup.reason in ("cancel", "pause", "shutdown"):
        return sup.reason
    status = (read_summary(sup.run_dir) or {}).get("status")
    if status != RunStatus.CANCELLED and returncode not in STOP_SIGNAL_EXITS:
        return ""
    # Stopped by a signal this supervisor did not send (or had not sent yet).
    if SHUTDOWN.is_set():
        return "shutdown"
    return job_services.stop_requested(sup.claim) or "interrupted"


def outcome(
    returncode: int, run_dir: Path, log_path: Path, *, cancelled: bool
) -> tuple[str, dict[str, Any] | None, str]:
    """(status, summary, error) from the exit code and the trainer's summary file."""
    summary = read_summary(run_dir)
    if summary is not None and summary.get("status") in RunStatus.values:
        status = summary["status"]
        error = "" if status != RunStatus.FAILED else log_tail(log_path)
        return status, summary, error
    if returncode == BAD_INPUT_EXIT_CODE:
        return (
            RunStatus.FAILED,
            summary,
            f"invalid config ({run_dir / CONFIG_FILE}; log {log_path}):\n" + log_tail(log_path),
        )
    if cancelled:
        return RunStatus.CANCELLED, summary, ""
    if returncode == 0:
        return RunStatus.SUCCEEDED, summary, ""
    return (
        RunStatus.FAILED,
        summary,
        f"trainer exited with code {returncode} (log {log_path})\n{log_tail(log_path)}",
    )


def config_field_errors(run_dir: Path, returncode: int) -> dict[str, list[str]] | None:
    """The config fields the trainer refused (exit BAD_INPUT_EXIT_CODE), as
    ``{path: [messages]}`` from the run folder's field_errors.json; None for any
    other exit. A refusal that left no file is named as the config's whole."""
    if returncode != BAD_INPUT_EXIT_CODE:
        return None
    errors = read_field_errors(run_dir) or [
        ("", f"the trainer refused its config (exit code {BAD_INPUT_EXIT_CODE}): see its log")
    ]
    return FieldError(errors).as_dict()


def member_exit(claim: job_services.Claim, sup: Supervision, returncode: int, log_path) -> str:
    """A gang member's trainer ended. The leader records a run that ended well;
    a member whose ranks failed sends the whole run back to resume on a new gang
    (the leader's heartbeat then fails and it stops its own ranks)."""
    if stop_cause(sup, returncode) or returncode in (0, BAD_INPUT_EXIT_CODE):
        return f"node {claim.node} done"  # the leader records the outcome (a bad config too)
    reason = f"node {claim.node}'s ranks failed (exit {returncode})"
    return retry_later(claim, sup, reason, log_path)


def gang_leader_exit(
    claim: job_services.Claim, sup: Supervision, returncode: int, log_path, cause: str
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
    if cause == "interrupted" and status == RunStatus.CANCELLED:
        give_back(claim, sup, "a member of its gang stopped (its worker shut down)", log_path)
        return "requeued"
    failed = status == RunStatus.FAILED or (summary is None and returncode != 0)
    if failed and returncode != BAD_INPUT_EXIT_CODE and sup.reason == "":
        why = (summary or {}).get("error", "").strip().splitlines()[-1:] or [f"exit {returncode}"]
        return retry_later(claim, sup, f"the gang's ranks failed ({why[0][:300]})", log_path)
    return None


def retry_later(claim: job_services.Claim, sup: Supervision, reason: str, log_path) -> str:
    """The trainer found the folder held by another trainer, outlived its lease
    while this worker was too slow to renew it, was stopped from outside, or a
    gang lost a member: the run goes back to the queue (the attempt is spent),
    or fails once attempts run out, with the reason."""
    run = Run.objects.get(pk=claim.run_id)
    if claim.attempt >= run.max_attempts:
        error = f"{reason}, {claim.attempt} times\n{log_tail(log_path)}"
        job_services.finish_run(
            claim,
            status=RunStatus.FAILED,
            summary=None,
            error=error,
            current_step=sup.steps_done,
        )
        return RunStatus.FAILED
    job_services.requeue_attempt(
        claim, error=f"attempt {claim.attempt}: {reason}; requeued", current_step=sup.steps_done
    )
    log.warning("run %s attempt %s: %s; requeued", *ids(claim), reason)
    return "requeued"


def give_back(claim: job_services.Claim, sup: Supervision, why: str, log_path: Path) -> None:
    """The trainer was interrupted (``why``), not cancelled: put the run back in
    the queue without spending an attempt, say so where people look (the run's
    error line, the worker's log, the end of trainer.log), and drop the
    trainer's summary, whose ``cancelled`` describes a stop, not the run."""
    note = f"interrupted: {why}; back in the queue, {resume_note(sup)}"
    job_services.requeue_attempt(
        claim, error=f"attempt {claim.attempt} {note}", current_step=sup.steps_done, spent=False
    )
    (sup.run_dir / SUMMARY_FILE).unlink(missing_ok=True)
    append_to_log(log_path, f"=== attempt {claim.attempt} {note}")
    log.warning("run %s attempt %s %s", *ids(claim), note)


def resume_note(sup: Supervision) -> str:
    """Where the next attempt picks the run up, in words."""
    if has_checkpoint(sup.run_dir):
        return "the next attempt resumes from its last checkpoint"
    if sup.steps_done > 0:
        return "the next attempt starts RL again from step 0 (no checkpoint yet)"
    try:
        ws = json.loads((sup.run_dir / CONFIG_FILE).read_text()).get("warm_start", {})
    except (OSError, ValueError, AttributeError):
        ws = {}
    if ws.get("enabled", True) and ws.get("cache", True):  # the warm start keeps its progress
        return "the next attempt resumes the warm start where it stopped"
    return "the next attempt starts again from step 0 (no checkpoint yet)"


def append_to_log(log_path: Path, line: str) -> None:
    try:
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(f"\n{line}\n")
    except OSError:
        pass  # the run's error line and the worker's log still say it
