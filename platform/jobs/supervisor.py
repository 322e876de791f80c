"""Run one claimed run: spawn the trainer as a child process, stream its
metrics into the DB in batches, heartbeat, honour cancel, record the outcome.

Why a child process (DESIGN.md 2): GPU memory is released when the run ends, a
crashing run cannot take the worker down, torchrun works unchanged for
several GPUs, and the trainer stays usable without Django.

The child is tied to the worker's life (Linux PR_SET_PDEATHSIG): when the
worker is killed, the trainer dies with it, so a requeued attempt never races
an orphan writing the same run folder.
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
from django.db import transaction
from django.db.models import F

from jobs import services as job_services
from jobs.childproc import kill_group, tied_to_this_process
from jobs.dispatch import new_task_id, send_run_on_commit
from jobs.tailer import MetricsTail
from runs import services as run_services
from runs.columns import chunk_of
from runs.models import Run, RunStatus

log = logging.getLogger("jobs")

REPO_ROOT = Path(settings.BASE_DIR)
EXIT_BAD_CONFIG = 2  # trainer.cli.EXIT_BAD_CONFIG (DESIGN.md 3.2)
LOG_TAIL_CHARS = 4000

# Set by the worker's shutdown signal (jobs.signals): stop the trainer
# gracefully (it checkpoints) and give the run back to the queue.
SHUTDOWN = threading.Event()
# The run this worker process is training (read by the registry heartbeat).
CURRENT_RUN: dict[str, int | None] = {"id": None}


def trainer_command(config_path: Path, run_dir: Path, *, resume: bool, gpus: int) -> list[str]:
    """``python -m trainer run --config ... --out ...`` (torchrun for several GPUs)."""
    args = ["-m", "trainer", "run", "--config", str(config_path), "--out", str(run_dir)]
    if resume:
        args.append("--resume")
    if gpus > 1:
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
        return [sys.executable, *launcher, *args]
    return [sys.executable, *args]


def has_checkpoint(run_dir: Path) -> bool:
    ckpt = run_dir / "checkpoints"
    return ckpt.is_dir() and any(ckpt.iterdir())


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
    pending: list[dict[str, Any]] = field(default_factory=list)
    sealed_chunks: int = 0  # the run's leading chunks of metrics kept as columns

    @property
    def steps_done(self) -> int:
        return self.last_step + 1


def _ingest(sup: Supervision, records: list[dict[str, Any]]) -> None:
    batch = settings.LAB_METRICS_BATCH
    for i in range(0, len(records), batch):
        run_services.ingest_metrics(sup.claim.run_id, records[i : i + batch])
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    if steps:
        sup.last_step = max(sup.last_step, *steps)
        if chunk_of(max(steps)) > sup.sealed_chunks:
            # Training moved into a new chunk: the ones before it are settled.
            # Keeping them as columns keeps live comparisons' row reads short.
            sup.sealed_chunks = run_services.seal_metrics(sup.claim.run_id)


def execute(run_id: int, *, worker_host: str) -> str:
    """Claim and train ``run_id``; returns what happened (for logs and tests)."""
    gpu_index = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    claim = job_services.claim_run(run_id, worker_host=worker_host, gpu_index=gpu_index)
    if claim is None:
        log.info("run %s: not queued any more (claimed, cancelled or finished); skipping", run_id)
        return "skipped"
    CURRENT_RUN["id"] = run_id
    try:
        return _supervise(claim)
    finally:
        CURRENT_RUN["id"] = None


def _supervise(claim: job_services.Claim) -> str:
    run = Run.objects.get(pk=claim.run_id)
    run_dir = Path(run.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.json"
    config_path.write_text(json.dumps(run.config, indent=2, sort_keys=True))
    (run_dir / "summary.json").unlink(missing_ok=True)  # never read a previous attempt's
    resume = has_checkpoint(run_dir)
    cmd = trainer_command(config_path, run_dir, resume=resume, gpus=run.config["run"]["gpus"])
    log_path = run_dir / "trainer.log"
    log.info("run %s attempt %s: %s", claim.run_id, claim.attempt, " ".join(cmd))

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "ab") as log_fh:
        log_fh.write(f"\n=== attempt {claim.attempt}: {' '.join(cmd)}\n".encode())
        log_fh.flush()
        proc = subprocess.Popen(
            tied_to_this_process(cmd),
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C reaches the worker only
        )
    sup = Supervision(claim=claim, run_dir=run_dir, tail=MetricsTail(run_dir / "metrics.jsonl"))
    try:
        returncode = _watch(proc, sup)
    except BaseException:
        # The supervisor itself failed (e.g. the database went away): never leave
        # an unwatched trainer behind. The run keeps status running, its
        # heartbeat goes stale, and the reconciler requeues it to resume.
        kill_group(proc, signal.SIGKILL)
        proc.wait()
        raise

    # Final pass over the whole file: the DB ends equal to the trainer's record,
    # including steps a resumed trainer rewound and rewrote.
    records = sup.tail.read_all()
    _ingest(sup, records)
    file_steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    if file_steps:
        run_services.drop_metrics_after(claim.run_id, max(file_steps))
        sup.last_step = max(file_steps)

    if sup.reason == "lost":
        return "lost"
    if sup.reason == "shutdown":
        _give_back(claim, sup)
        return "requeued"
    status, summary, error = outcome(
        returncode, run_dir, log_path, cancelled=sup.reason == "cancel"
    )
    job_services.finish_run(
        claim, status=status, summary=summary, error=error, current_step=sup.steps_done
    )
    log.info("run %s attempt %s: %s (exit %s)", claim.run_id, claim.attempt, status, returncode)
    return status


def _watch(proc: subprocess.Popen, sup: Supervision) -> int:
    """Poll loop until the trainer exits; returns its exit code."""
    poll_s = settings.LAB_POLL_S
    heartbeat_s = settings.LAB_HEARTBEAT_S
    cancel_check_s = min(1.0, heartbeat_s)
    last_beat = last_cancel_check = 0.0
    while True:
        returncode = proc.poll()
        records = sup.tail.read_new()
        if records:
            _ingest(sup, records)
        if returncode is not None:
            return returncode
        now = time.monotonic()
        if now - last_beat >= heartbeat_s:
            last_beat = now
            if not job_services.heartbeat(
                sup.claim, sup.steps_done if sup.last_step >= 0 else None
            ):
                # The reconciler gave this run to another attempt: stop at once.
                log.warning(
                    "run %s attempt %s lost ownership; killing trainer",
                    sup.claim.run_id,
                    sup.claim.attempt,
                )
                sup.reason = "lost"
                kill_group(proc, signal.SIGKILL)
                return proc.wait()
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
            elif job_services.cancel_requested(sup.claim):
                sup.reason = "cancel"
            if sup.reason:
                # Cooperative stop: the trainer finishes its step, checkpoints, exits.
                proc.send_signal(signal.SIGTERM)
                sup.term_sent_at = now
        time.sleep(poll_s)


def outcome(
    returncode: int, run_dir: Path, log_path: Path, *, cancelled: bool
) -> tuple[str, dict[str, Any] | None, str]:
    """(status, summary, error) from the exit code and summary.json."""
    summary = None
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        summary = None
    if summary is not None and summary.get("status") in RunStatus.values:
        status = summary["status"]
        error = "" if status != RunStatus.FAILED else _log_tail(log_path)
        return status, summary, error
    if returncode == EXIT_BAD_CONFIG:
        return RunStatus.FAILED, summary, "invalid config:\n" + _log_tail(log_path)
    if cancelled:
        return RunStatus.CANCELLED, summary, ""
    if returncode == 0:
        return RunStatus.SUCCEEDED, summary, ""
    return (
        RunStatus.FAILED,
        summary,
        f"trainer exited with code {returncode}\n{_log_tail(log_path)}",
    )


def _give_back(claim: job_services.Claim, sup: Supervision) -> None:
    """The worker is shutting down: put the run back in the queue without
    spending an attempt; the next worker resumes from the checkpoint just written."""
    run = Run.objects.get(pk=claim.run_id)
    task_id = new_task_id()
    with transaction.atomic():
        given = Run.objects.filter(
            pk=claim.run_id, status=RunStatus.RUNNING, attempts=claim.attempt
        ).update(
            status=RunStatus.QUEUED,
            attempts=F("attempts") - 1,
            task_id=task_id,
            worker_host="",
            current_step=sup.steps_done,
            error="worker shut down; requeued to resume from its checkpoint",
        )
        if given:
            send_run_on_commit(run.pk, run.queue, run.priority, task_id)
