"""The lab's own endpoint beside MLflow's: TensorBoard event files of a run
(``POST /api/tracking/tensorboard``), read into an external run
(tracking/tensorboard.py)."""

from __future__ import annotations

from lab.runs.models import Run
from lab.tracking import payload, services, tb_jobs
from lab.tracking.errors import invalid, missing
from lab.tracking.http import endpoint, run_id_of


@endpoint("POST")
def tensorboard_import(request, user, body):
    """``{"experiment_id", "path", "run_name", "framework", "run_id", "final",
    "steps_per_rollout"}``: read the
    event files in ``path`` (inside LAB_ASSET_ROOTS) into a new external run, or into
    ``run_id`` again (a folder still being written: only what is new is added).
    ``final`` (default true) ends the run with the import; false leaves it running for
    the next call. ``steps_per_rollout``: slime's train steps per rollout (default:
    inferred). A folder over LAB_TENSORBOARD_INLINE_BYTES is imported by the control
    queue's worker: the answer then says ``"import_status": "queued"`` and
    ``GET /api/tracking/tensorboard/status?import_id=N`` follows it. The answer lists
    the points read and skipped, each file's records and problems, and what was not
    imported (text, images, ...) with the reason (tracking/tb_jobs.py)."""
    from pathlib import Path

    from lab.assets.roots import check_path
    from trainer.errors import FieldError

    raw = payload.text(body, "path", max_length=4096)
    try:
        folder = Path(check_path("path", raw))
    except FieldError as exc:
        raise invalid(f"Invalid value for parameter 'path': {exc}") from None
    if not folder.is_dir():
        raise invalid(f"Invalid value for parameter 'path': {raw} is not a folder")
    framework = payload.text(body, "framework", max_length=20, required=False)
    if framework and framework not in services.metric_map.FRAMEWORKS:
        raise invalid(
            f"Invalid value for parameter 'framework': one of {', '.join(services.metric_map.FRAMEWORKS)}"
        )
    steps_per_rollout = payload.integer(body, "steps_per_rollout", lo=1, hi=100000)
    final = body.get("final", True)
    if not isinstance(final, bool):
        raise invalid("Invalid value for parameter 'final': true or false")
    job = tb_jobs.request_import(
        user=user,
        folder=folder,
        experiment_id=body.get("experiment_id"),
        run_id=run_id_of(body) if body.get("run_id") not in (None, "") else None,
        run_name=payload.text(
            body, "run_name", max_length=payload.MAX_RUN_NAME_LENGTH, required=False
        ),
        framework=framework,
        steps_per_rollout=steps_per_rollout,
        final=final,
    )
    return _answer(job)


def _answer(job) -> dict:
    from lab.tracking.models import TrackedRun

    run = Run.all_objects.get(pk=job.run_id)
    tracked = TrackedRun.objects.filter(run_id=run.pk).first()
    return {
        **tb_jobs.describe(job),
        "status": run.status,
        "not_imported": tracked.import_notes if tracked is not None else [],
    }


@endpoint("GET")
def tensorboard_import_status(request, user, body):
    """``?import_id=N``: where an import stands (queued, running, succeeded, failed)
    with the points read and skipped and each file's records and problems."""
    from lab.tracking.models import TensorBoardImportJob

    job_id = payload.integer(body, "import_id", lo=1, hi=2**62)
    if job_id is None:
        raise invalid("Missing value for required parameter 'import_id'")
    job = TensorBoardImportJob.objects.filter(pk=job_id).first()
    if job is None:
        raise missing(f"No TensorBoard import with id {job_id}")
    return _answer(job)
