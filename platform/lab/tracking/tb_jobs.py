"""TensorBoard imports as jobs: every import ends ``succeeded`` or ``failed`` with
the points read and skipped and each file's records and problems; none is left
``running``, and neither is its run.

    job = request_import(user=..., experiment_id=..., folder=..., final=True)   # the request
    run_import(job.pk)            # the control queue's worker (or the request, for a small folder)
    reconcile_imports()           # the reconciler: a lost message re-sent, a dead worker's job ended

A folder over ``LAB_TENSORBOARD_INLINE_BYTES`` of event files is imported by the
control queue's worker (``tracking.import_tensorboard``), never in a web request:
a 52 MB file of 10^6 scalars once ran into the web worker's timeout (a 500) and
left its run running with no point. The request creates the run and answers at
once with its id and the job's.

What ends a job (``run_import``): no event file, or nothing to import (no
record, no scalar or histogram) is ``failed``; a truncated or corrupt file
(tracking/tb_files.py) is listed with its problem, and the job ``succeeded``
when any point was read, ``failed`` when none was. An import that ends the run
(``final``) ends it ``succeeded`` or ``failed`` with it; an exception anywhere
fails both, with the reason. A folder still being written (``final`` false)
may end with a cut-short last record: that is not a problem then.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from lab.runs.models import Run, RunStatus
from lab.tracking import services
from lab.tracking.errors import MlflowError
from lab.tracking.models import ImportStatus, TensorBoardImportJob
from lab.tracking.tb_files import event_bytes, scan_folder

IMPORT_TASK = "tracking.import_tensorboard"
IMPORT_QUEUE = "control"
log = logging.getLogger("lab.tracking")


def request_import(
    *,
    user,
    folder: Path,
    experiment_id=None,
    run_id: int | None = None,
    run_name: str = "",
    framework: str = "",
    steps_per_rollout: int | None = None,
    final: bool = True,
) -> TensorBoardImportJob:
    """Create (or reuse) the external run and the job; import now when the folder is
    small, else queue it on the control queue. MlflowError for a bad run or experiment."""
    from lab.tracking.tensorboard import TensorBoardImport

    if run_id is not None:
        run, _ = services.get_run(run_id)
        if not run.can_manage(user):
            raise MlflowError(
                "PERMISSION_DENIED", f"only the owner of run {run.pk} or staff can write to it"
            )
    else:
        run = TensorBoardImport.start(
            user=user,
            experiment_id=experiment_id,
            folder=folder,
            run_name=run_name,
            framework=framework,
            steps_per_rollout=steps_per_rollout,
        ).run
    job = TensorBoardImportJob.objects.create(
        run=run, owner=user, folder=str(folder), steps_per_rollout=steps_per_rollout, final=final
    )
    if event_bytes(folder) <= settings.LAB_TENSORBOARD_INLINE_BYTES:
        run_import(job.pk)
    else:
        transaction.on_commit(lambda: publish(job.pk))
    job.refresh_from_db()
    return job


def publish(job_id: int) -> None:
    """Send the job to the control queue; a broker that refuses leaves it queued for
    the reconciler to send again (``reconcile_imports``)."""
    from celery import current_app as app  # lab.site.celery's app (design.md 1.2)

    try:
        app.send_task(IMPORT_TASK, args=[job_id], queue=IMPORT_QUEUE, retry=False)
    except Exception:  # kombu/redis raise many types for "broker down"
        log.warning(
            "TensorBoard import %s: the broker refused it; the reconciler resends it", job_id
        )


def _claim(job_id: int) -> bool:
    """queued -> running (or a running job whose worker died: its message came back)."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.LAB_IMPORT_STALE_AFTER_S)
    return bool(
        TensorBoardImportJob.objects.filter(pk=job_id)
        .filter(
            Q(status=ImportStatus.QUEUED) | Q(status=ImportStatus.RUNNING, heartbeat_at__lt=stale)
        )
        .update(status=ImportStatus.RUNNING, started_at=now, heartbeat_at=now)
    )


def run_import(job_id: int) -> str:
    """Import the job's folder and record how it ended (see the module docstring).
    Idempotent: a job already ended, or running elsewhere, is left as it is."""
    from lab.tracking.tensorboard import TensorBoardImport

    if not _claim(job_id):
        return "skipped"
    job = TensorBoardImportJob.objects.select_related("owner").get(pk=job_id)
    folder = Path(job.folder)
    try:
        reports = scan_folder(folder) if folder.is_dir() else []
        files = [r.as_dict() for r in reports]
        TensorBoardImportJob.objects.filter(pk=job_id).update(
            files=files, heartbeat_at=timezone.now()
        )
        if not reports:
            return _end(job, ImportStatus.FAILED, f"no event file (*tfevents*) in {folder}")
        importer = TensorBoardImport.resume(job.run_id, folder, job.steps_per_rollout)
        points = importer.poll(job.owner)
        # A folder still being written may end with a record cut short: expected then.
        problems = [
            f"{r.file}: {r.problem}"
            for r in reports
            if r.problem and not (r.incomplete_tail and not job.final and r.records)
        ]
        records = sum(r.records for r in reports)
        TensorBoardImportJob.objects.filter(pk=job_id).update(
            points=points, skipped=importer.skipped
        )
        if points == 0:
            why = "; ".join(problems) or (
                f"nothing to import: {records} record(s) in {len(reports)} file(s), no scalar "
                "or histogram"
            )
            return _end(job, ImportStatus.FAILED, why)
        return _end(job, ImportStatus.SUCCEEDED, "; ".join(problems))
    except Exception as exc:  # an import never stays running: the reason is kept
        log.exception("TensorBoard import %s failed", job_id)
        text = exc.message if isinstance(exc, MlflowError) else f"{type(exc).__name__}: {exc}"
        return _end(job, ImportStatus.FAILED, text)


def _end(job: TensorBoardImportJob, status: str, error: str) -> str:
    """Record the run's end when this import ends it (or failed), then the job's."""
    run_status = RunStatus.SUCCEEDED if status == ImportStatus.SUCCEEDED else RunStatus.FAILED
    ends_run = job.final or status == ImportStatus.FAILED
    run = Run.all_objects.filter(pk=job.run_id).first()
    if ends_run and run is not None and run.status in (RunStatus.RUNNING, RunStatus.LOST):
        mlflow_status = "FINISHED" if run_status == RunStatus.SUCCEEDED else "FAILED"
        try:
            services.update_run(user=job.owner, run_id=job.run_id, status=mlflow_status)
        except Exception:  # the job's end is recorded; the run's is the reconciler's then
            log.exception("TensorBoard import %s: could not end run %s", job.pk, job.run_id)
            Run.all_objects.filter(pk=job.run_id, status=RunStatus.RUNNING).update(
                status=run_status, finished_at=timezone.now()
            )
        if error and run_status == RunStatus.FAILED:
            Run.all_objects.filter(pk=job.run_id).update(
                error=f"TensorBoard import: {error}"[:8000]
            )
    # The job last: whoever sees it ended sees its run ended too.
    TensorBoardImportJob.objects.filter(pk=job.pk).update(
        status=status, error=error[:8000], finished_at=timezone.now(), heartbeat_at=timezone.now()
    )
    return status


def reconcile_imports() -> list[tuple[int, str]]:
    """The reconciler's part: a queued job whose message was lost is sent again; a
    running job whose worker stopped heartbeating past LAB_IMPORT_STALE_AFTER_S is
    failed (and its run), so nothing is left running."""
    now = timezone.now()
    actions = []
    resend = TensorBoardImportJob.objects.filter(
        status=ImportStatus.QUEUED,
        created_at__lt=now - timedelta(seconds=settings.LAB_REPUBLISH_AFTER_S),
    ).values_list("pk", flat=True)[:100]
    for job_id in resend:
        publish(job_id)
        actions.append((job_id, "republished"))
    stale = now - timedelta(seconds=settings.LAB_IMPORT_STALE_AFTER_S)
    for job in TensorBoardImportJob.objects.filter(
        status=ImportStatus.RUNNING, heartbeat_at__lt=stale
    ).select_related("owner")[:100]:
        if TensorBoardImportJob.objects.filter(
            pk=job.pk, status=ImportStatus.RUNNING, heartbeat_at__lt=stale
        ).update(heartbeat_at=now):
            _end(job, ImportStatus.FAILED, "the worker importing it stopped; import it again")
            actions.append((job.pk, "failed"))
    return actions


def describe(job: TensorBoardImportJob) -> dict:
    """The job as the API answers it."""
    return {
        "import_id": str(job.pk),
        "run_id": str(job.run_id),
        "import_status": job.status,
        "points": job.points,
        "skipped": job.skipped,
        "files": job.files,
        "error": job.error,
    }
