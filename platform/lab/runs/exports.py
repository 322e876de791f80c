"""Exports of a run's checkpoint as a Hugging Face folder: request (atomic, the
job published after commit) and the worker-side claim and outcome.

The folder lands in the run folder, ``RUN_DIR/exports/step<N>-<dtype>/``, on
the volume every worker shares, so vLLM, SGLang or transformers on any host
of the team can load it. The work runs on the ``control`` queue's worker (the
reconciler's), which every deployment has live, never on a training slot.
"""

from __future__ import annotations

import logging
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from lab.experiments import rights
from lab.runs.models import CheckpointExport, ExportStatus, Run
from trainer.errors import FieldError
from trainer.run_folder.files import checkpoint_path

EXPORT_QUEUE = "control"
# The keys of trainer.hf.export.DTYPES (tests/platform/test_exports.py holds them
# equal): that module loads torch, which the web process never imports; the
# worker imports it in run_export.
EXPORT_DTYPES = ("float32", "bfloat16", "float16")
log = logging.getLogger("jobs")


def export_folder(run: Run, step: int, dtype: str) -> Path:
    return Path(run.run_dir) / "exports" / f"step{step}-{dtype}"


def last_checkpoint_step(run: Run) -> int | None:
    """The step of the one checkpoint a run keeps, when the run is over and has one."""
    if run.is_active or not run.run_dir or not checkpoint_path(Path(run.run_dir)).exists():
        return None
    return (run.summary or {}).get("steps") or run.current_step


def request_export(run: Run, *, user, dtype: str = "float32") -> CheckpointExport:
    """Queue an export of the run's last checkpoint; a FieldError names what is wrong.
    Asking again for the same step and dtype returns the existing export unless it failed."""
    rights.check_can_queue(user, run.experiment)  # an export spends a worker's time
    if dtype not in EXPORT_DTYPES:
        raise FieldError([("dtype", f"choose one of {', '.join(EXPORT_DTYPES)}")])
    if run.is_external:
        raise FieldError(
            [("run", "an external run's checkpoint is not in the lab; export it where it trained")]
        )
    step = last_checkpoint_step(run)
    if step is None:
        raise FieldError([("run", "only a finished run with a checkpoint can be exported")])
    with transaction.atomic():
        existing = (
            CheckpointExport.objects.select_for_update()
            .filter(run=run, step=step, dtype=dtype)
            .exclude(status=ExportStatus.FAILED)
            .first()
        )
        if existing is not None:
            return existing
        export = CheckpointExport.objects.create(
            run=run,
            requested_by=user,
            step=step,
            dtype=dtype,
            out_dir=str(export_folder(run, step, dtype)),
        )
        transaction.on_commit(lambda: _publish(export.pk))
    return export


EXPORT_TASK = "jobs.tasks.export_checkpoint"


def _publish(export_id: int) -> None:
    """Send the job; a broker that refuses leaves the export queued, with the reason."""
    from celery import (
        current_app as app,
    )  # lab.site.celery's app (design.md 1.2)

    try:
        app.send_task(EXPORT_TASK, args=[export_id], queue=EXPORT_QUEUE, retry=False)
    except Exception as exc:  # kombu/redis raise many types for "broker down"
        CheckpointExport.objects.filter(pk=export_id, status=ExportStatus.QUEUED).update(
            status=ExportStatus.FAILED, error=f"could not queue the export: {exc}"
        )


def claim_export(export_id: int) -> CheckpointExport | None:
    """queued -> running in one conditional UPDATE; None for a repeated delivery."""
    won = CheckpointExport.objects.filter(pk=export_id, status=ExportStatus.QUEUED).update(
        status=ExportStatus.RUNNING
    )
    return CheckpointExport.objects.select_related("run").get(pk=export_id) if won else None


def finish_export(export: CheckpointExport, error: str = "") -> None:
    CheckpointExport.objects.filter(pk=export.pk, status=ExportStatus.RUNNING).update(
        status=ExportStatus.FAILED if error else ExportStatus.SUCCEEDED,
        error=error[-4000:],
        finished_at=timezone.now(),
    )


def run_export(export_id: int) -> str:
    """The worker's side: claim, write the folder, record the outcome (idempotent:
    a repeated delivery finds the export claimed and does nothing)."""
    from trainer.run.export import export_run  # worker only: loads torch

    export = claim_export(export_id)
    if export is None:
        return "skipped"
    try:
        # The folder is the lab's own (RUN_DIR/exports/step<N>-<dtype>, one live
        # export per run, step and dtype): an earlier failed export of the same
        # step may have left it, so it is replaced as a whole, never refused.
        export_run(
            Path(export.run.run_dir),
            export.step,
            Path(export.out_dir),
            export.dtype,
            replace=True,
        )
    except FieldError as exc:  # the checkpoint moved on or the folder is not a run
        finish_export(export, str(exc))
        return ExportStatus.FAILED
    except Exception as exc:  # disk full, unreadable volume: say so on the page
        log.exception("export %s failed", export_id)
        finish_export(export, f"{type(exc).__name__}: {exc}")
        return ExportStatus.FAILED
    finish_export(export)
    return ExportStatus.SUCCEEDED
