"""The lab's own endpoint beside MLflow's: TensorBoard event files of a run
(``POST /api/tracking/tensorboard``), read into an external run
(tracking/tensorboard.py)."""

from __future__ import annotations

from lab.tracking import payload, services
from lab.tracking.errors import invalid
from lab.tracking.http import endpoint, run_id_of


@endpoint("POST")
def tensorboard_import(request, user, body):
    """``{"experiment_id", "path", "run_name", "framework", "run_id", "final",
    "steps_per_rollout"}``: read the
    event files in ``path`` (inside LAB_ASSET_ROOTS) into a new external run, or into
    ``run_id`` again (a folder still being written: only what is new is added).
    ``final`` (default true) marks the run finished; false leaves it running for the
    next call. ``steps_per_rollout``: slime's train steps per rollout (default: inferred).
    The answer lists what was not imported (text, images, ...) with the reason."""
    from pathlib import Path

    from lab.assets.roots import check_path
    from lab.tracking.tensorboard import TensorBoardImport
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
    if body.get("run_id") not in (None, ""):
        job = TensorBoardImport.resume(
            services.get_run(run_id_of(body))[0].pk, folder, steps_per_rollout
        )
    else:
        job = TensorBoardImport.start(
            user=user,
            experiment_id=body.get("experiment_id"),
            folder=folder,
            run_name=payload.text(
                body, "run_name", max_length=payload.MAX_RUN_NAME_LENGTH, required=False
            ),
            framework=framework,
            steps_per_rollout=steps_per_rollout,
        )
    points = job.poll(user)
    run = job.finish(user) if final else job.run
    return {
        "run_id": str(run.pk),
        "points": points,
        "status": run.status,
        "not_imported": job.tracked.import_notes,
    }
