"""Writes of the MLflow tracking API (and the TensorBoard import): experiments, external
runs, their params, tags and metric points. Each write is one transaction; a
refusal (``MlflowError``) stores nothing.

An external run is a ``runs.Run`` with ``origin = external`` whose metrics go
into the lab's one metric store (``MetricStep``, a row per (run, step)), so
the charts, compare, the stability review and survival statistics read it
like a lab run. Points are merged into the step's row under the run's lock
(``runs.metrics.seal.lock_run``, the lock every metric write takes), so the
store holds one value per (run, key, step): a client that retries a batch
writes the same values again and adds nothing (idempotent per (run, key,
step, timestamp, value)). Two points of one key at one step keep the one
with the later timestamp within a batch, and the later write across batches.

Status: MLflow's RUNNING / SCHEDULED -> running, FINISHED -> succeeded,
FAILED -> failed, KILLED -> cancelled. An external run never enters the
lab's queue (``queue = "external"``, never ``queued``) and has no heartbeat,
so the reconciler leaves it alone. When it ends, the lab's collapse rule
(trainer/analysis/collapse.py) runs over its stored accuracy and the outcome is its
summary, as a lab run's trainer writes it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from lab.experiments.models import Experiment
from lab.experiments.rights import can_queue
from lab.experiments.services import create_experiment as create_lab_experiment
from lab.runs.metrics.columns import chunk_of
from lab.runs.metrics.seal import lock_run, seal_metrics
from lab.runs.models import FINAL_STATUSES, MetricStep, Run, RunOrigin, RunStatus
from lab.tracking import metric_map
from lab.tracking.errors import (
    PERMISSION_DENIED,
    RESOURCE_ALREADY_EXISTS,
    MlflowError,
    invalid,
    missing,
)
from lab.tracking.models import TrackedRun
from lab.tracking.payload import Point
from lab.tracking.points import store_points
from trainer import metric_keys as mk
from trainer.analysis.collapse import detect_from_rows
from trainer.config import CollapseConfig
from trainer.errors import FieldError

EXTERNAL_QUEUE = "external"
# Tags the lab reads (docs/integrations.md): the framework when its metric names do not
# say it, and the answers per step the collapse rule's binomial noise assumes.
FRAMEWORK_TAG = "lab.framework"
HOST_TAG = "lab.host"
SAMPLES_TAG = "lab.samples_per_step"
DEFAULT_SAMPLES_PER_STEP = 128  # CollapseDetector's default

MLFLOW_TO_LAB_STATUS = {
    "RUNNING": RunStatus.RUNNING,
    "SCHEDULED": RunStatus.RUNNING,
    "FINISHED": RunStatus.SUCCEEDED,
    "FAILED": RunStatus.FAILED,
    "KILLED": RunStatus.CANCELLED,
}
LAB_TO_MLFLOW_STATUS = {
    RunStatus.QUEUED: "SCHEDULED",
    RunStatus.RUNNING: "RUNNING",
    RunStatus.SUCCEEDED: "FINISHED",
    RunStatus.FAILED: "FAILED",
    RunStatus.CANCELLED: "KILLED",
    # MLflow has no such state: a lost run has not ended, and its client may still
    # log (which makes it running again). The lab's pages say "lost".
    RunStatus.LOST: "RUNNING",
}


def now_ms() -> int:
    return int(time.time() * 1000)


# --------------------------------------------------------------------------- experiments


DEFAULT_EXPERIMENT_ID = "0"
DEFAULT_EXPERIMENT_NAME = "Default"


def get_experiment(experiment_id: Any, user=None) -> Experiment:
    """The experiment with this id. MLflow's default experiment, id "0" (where a client
    that names none logs), is the caller's own experiment called "Default", made on
    first use."""
    if str(experiment_id).strip() == DEFAULT_EXPERIMENT_ID and user is not None:
        return _default_experiment(user)
    pk = _id(experiment_id, "experiment_id")
    experiment = Experiment.objects.filter(pk=pk).first()
    if experiment is None:
        raise missing(f"No Experiment with id={experiment_id} exists")
    return experiment


def _default_experiment(user) -> Experiment:
    with transaction.atomic():
        experiment = (
            Experiment.objects.filter(owner=user, name=DEFAULT_EXPERIMENT_NAME)
            .order_by("pk")
            .first()
        )
        if experiment is None:
            experiment = create_lab_experiment(
                owner=user,
                name=DEFAULT_EXPERIMENT_NAME,
                description="Runs logged through the MLflow tracking API without an experiment.",
            )
        return experiment


def get_experiment_by_name(name: str, user) -> Experiment:
    """The experiment called ``name``: the caller's own newest first, else the newest
    (lab experiment names are not unique; MLflow's are)."""
    named = Experiment.objects.filter(name=name).order_by("-created_at", "-pk")
    experiment = named.filter(owner=user).first() or named.first()
    if experiment is None:
        raise missing(f"Could not find experiment with name '{name}'")
    return experiment


def create_experiment(*, user, name: str) -> Experiment:
    """A new lab experiment owned by ``user`` (default base config: lab runs can be
    queued beside the external ones). MLflow names are unique: an existing name is
    RESOURCE_ALREADY_EXISTS."""
    if not name.strip():
        raise invalid("Invalid experiment name: ''")
    with transaction.atomic():
        if Experiment.objects.filter(name=name.strip()).exists():
            raise MlflowError(RESOURCE_ALREADY_EXISTS, f"Experiment(name={name}) already exists.")
        try:
            return create_lab_experiment(
                owner=user,
                name=name,
                description="Runs logged through the MLflow tracking API.",
            )
        except FieldError as exc:
            raise invalid(str(exc)) from None


# --------------------------------------------------------------------------- runs


def get_run(run_id: Any) -> tuple[Run, TrackedRun]:
    """An external run and its MLflow record; RESOURCE_DOES_NOT_EXIST for anything else."""
    pk = _id(run_id, "run_id")
    run = Run.objects.select_related("experiment", "owner").filter(pk=pk).first()
    tracked = TrackedRun.objects.filter(run_id=pk).first() if run is not None else None
    if run is None or tracked is None or run.origin != RunOrigin.EXTERNAL:
        raise missing(f"Run '{run_id}' not found")
    return run, tracked


def metric_history(run_id: Any, key: str) -> list[dict[str, Any]]:
    """MLflow's GetMetricHistory: every stored point of the metric ``key`` (the name
    as logged), by step. The store keeps one value per (step, key), the later
    timestamp's (``_store_points``), and the timestamp of the latest point only: the
    latest point carries its own, earlier ones the run's start time. A name never
    logged has no points."""
    from lab.runs.metrics.read import metric_series_many

    run, tracked = get_run(run_id)
    latest = tracked.latest_metrics.get(key)
    if latest is None:
        return []
    stored = tracked.stored_as.get(key, key)
    slot = metric_map.vector_slot(stored)
    series_key = slot[0] if slot else stored
    steps, values = metric_series_many([run.pk], [series_key])[run.pk].series.get(
        series_key, ((), ())
    )
    start = tracked.start_time or 0
    points = []
    for step, value in zip(steps, values, strict=True):
        if slot is not None:  # one expert's share, kept as a slot of the layer's vector
            vector = value or []
            value = vector[slot[1]] if slot[1] < len(vector) else None
            if value is None:
                continue
        value = float(value)
        step = int(step)
        points.append(
            {
                "key": key,
                "value": value if math.isfinite(value) else "NaN",
                "timestamp": latest[1] if step == latest[2] else start,
                "step": step,
            }
        )
    return points


def create_run(
    *,
    user,
    experiment_id: Any,
    run_name: str = "",
    start_time: int | None = None,
    tags: Iterable[tuple[str, str]] = (),
    client: str = "",
    remote_host: str = "",
) -> tuple[Run, TrackedRun]:
    """A new external run, running, in the experiment; the user must be allowed to
    queue runs there (its members and staff)."""
    experiment = get_experiment(experiment_id, user)
    if not can_queue(user, experiment):
        raise MlflowError(
            PERMISSION_DENIED,
            f"only the owner of experiment {experiment.pk}, the groups it is shared with "
            "and staff can add runs to it",
        )
    tag_map = dict(tags)
    run_name = run_name or tag_map.get("mlflow.runName", "")
    source = {
        "client": client,
        "framework": tag_map.get(FRAMEWORK_TAG, "") if _known(tag_map.get(FRAMEWORK_TAG)) else "",
        "host": tag_map.get(HOST_TAG) or remote_host,
        "source_name": tag_map.get("mlflow.source.name", ""),
        "user": tag_map.get("mlflow.user", ""),
    }
    with transaction.atomic():
        run = Run.objects.create(
            experiment=experiment,
            owner=user,
            variant=run_name[:200],
            config={"model": {}, "params": {}},
            seed=_seed(tag_map),
            status=RunStatus.RUNNING,
            queue=EXTERNAL_QUEUE,
            origin=RunOrigin.EXTERNAL,
            source=source,
            started_at=timezone.now(),
            heartbeat_at=timezone.now(),
            total_steps=1,
        )
        if run_name:
            tag_map.setdefault("mlflow.runName", run_name)
        tracked = TrackedRun.objects.create(
            run=run, tags=tag_map, start_time=start_time if start_time is not None else now_ms()
        )
    return run, tracked


def update_run(
    *,
    user,
    run_id: Any,
    status: str = "",
    end_time: int | None = None,
    run_name: str = "",
) -> tuple[Run, TrackedRun]:
    """MLflow's UpdateRun: a new status (a final one ends the run: its last metric
    chunk is sealed and collapse detection runs over it), end time, run name."""
    if status and status not in MLFLOW_TO_LAB_STATUS:
        raise invalid(
            f"Invalid value {status!r} for parameter 'status': one of "
            f"{', '.join(MLFLOW_TO_LAB_STATUS)}"
        )
    with transaction.atomic():
        run, tracked = _locked_for_write(user, run_id)
        fields: list[str] = []
        if run_name:
            run.variant = run_name[:200]
            tracked.tags["mlflow.runName"] = run_name
            fields.append("variant")
        final = False
        if status:
            run.status = MLFLOW_TO_LAB_STATUS[status]
            fields.append("status")
            final = run.status in FINAL_STATUSES
            if final:
                run.finished_at = timezone.now()
                run.summary = _outcome(run, tracked)
                fields += ["finished_at", "summary"]
            else:
                run.finished_at = None
                fields.append("finished_at")
        if end_time is not None:
            tracked.end_time = end_time
        elif final and tracked.end_time is None:
            tracked.end_time = now_ms()
        if fields:
            run.save(update_fields=fields)
        tracked.save()
    if final:
        seal_metrics(run.pk)
    return run, tracked


def delete_run(*, user, run_id: Any) -> None:
    """MLflow's DeleteRun: the run leaves the lab with its metrics and comments (the
    run's owner or staff, the lab's rule for deleting a run)."""
    with transaction.atomic():
        run, _ = _locked_for_write(user, run_id)
        run.delete()


def set_tag(*, user, run_id: Any, key: str, value: str) -> None:
    log_batch(user=user, run_id=run_id, tags=[(key, value)])


def delete_tag(*, user, run_id: Any, key: str) -> None:
    with transaction.atomic():
        _, tracked = _locked_for_write(user, run_id)
        if key not in tracked.tags:
            raise missing(f"No tag with name: {key} in run with id {run_id}")
        del tracked.tags[key]
        tracked.save(update_fields=["tags"])


def log_batch(
    *,
    user,
    run_id: Any,
    metrics: Sequence[Point] = (),
    params: Sequence[tuple[str, str]] = (),
    tags: Sequence[tuple[str, str]] = (),
) -> int:
    """MLflow's LogBatch (and LogMetric / LogParam / SetTag, batches of one), in one
    transaction: params (written once: a second value for a key is refused, the same
    value again is fine), tags, then the points merged into the metric store.
    Returns the points stored."""
    with transaction.atomic():
        run, tracked = _locked_for_write(user, run_id)
        if params:
            _log_params(run, params)
        if tags:
            tracked.tags.update(dict(tags))
            if _known(tracked.tags.get(FRAMEWORK_TAG)):
                run.source = {**run.source, "framework": tracked.tags[FRAMEWORK_TAG]}
        stored = store_points(run, tracked, list(metrics)) if metrics else 0
        run.save(update_fields=["config", "source", "current_step", "total_steps"])
        tracked.save()
        sealed_before = run.metric_chunks_sealed
    if metrics and chunk_of(max(p.step for p in metrics)) > sealed_before:
        # the run moved into a new chunk: the ones it left become columns (as the worker does)
        seal_metrics(run.pk)
    return stored


# --------------------------------------------------------------------------- internals


def _id(value: Any, field: str) -> int:
    text = str(value if value is not None else "").strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise invalid(f"Invalid value {value!r} for parameter '{field}'")
    return int(text)


def _known(framework: Any) -> bool:
    return isinstance(framework, str) and framework in metric_map.FRAMEWORKS


def _seed(tags: Mapping[str, str]) -> int:
    value = tags.get("seed") or tags.get("lab.seed") or ""
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else 0


def _locked_for_write(user, run_id: Any) -> tuple[Run, TrackedRun]:
    """Inside a transaction: the external run, row-locked (the metric store's lock), after
    the rights check: its owner or staff write to it."""
    run, _ = get_run(run_id)
    lock_run(run.pk)
    run = Run.objects.get(pk=run.pk)
    if not run.can_manage(user):
        raise MlflowError(
            PERMISSION_DENIED, f"only the owner of run {run.pk} or staff can write to it"
        )
    # Every write is a sign of life: the run's last contact, and a run marked lost
    # (silent past LAB_EXTERNAL_LOST_AFTER_S) that reports again is running again.
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
    Run.objects.filter(pk=run.pk, status=RunStatus.LOST).update(status=RunStatus.RUNNING, error="")
    run = Run.objects.get(pk=run.pk)
    tracked = TrackedRun.objects.get(run_id=run.pk)
    return run, tracked


def _log_params(run: Run, params: list[tuple[str, str]]) -> None:
    stored: dict[str, str] = run.config.setdefault("params", {})
    for key, value in params:
        if key in stored and stored[key] != value:
            raise invalid(
                f"Changing param values is not allowed. Param with key='{key}' was already "
                f"logged with value='{stored[key]}' for run ID='{run.pk}'. Attempted logging "
                f"new value '{value}'."
            )
        stored[key] = value


def _outcome(run: Run, tracked: TrackedRun) -> dict[str, Any]:
    """The run's summary as the lab's trainer writes it: the collapse rule
    (trainer/analysis/collapse.py, default CollapseConfig) over the stored batch accuracy,
    or the reward mean when the run logs no accuracy (a 0/1 verifier's reward is
    its accuracy)."""
    rows = list(
        MetricStep.objects.filter(run_id=run.pk).order_by("step").values_list("step", "values")
    )
    has_accuracy = any(mk.REWARD_ACCURACY in values for _, values in rows)
    source_key = mk.REWARD_ACCURACY if has_accuracy else mk.REWARD_MEAN
    samples_text = str(tracked.tags.get(SAMPLES_TAG, ""))
    samples = (
        int(samples_text)
        if samples_text.isascii() and samples_text.isdigit() and 0 < int(samples_text) < 10**9
        else DEFAULT_SAMPLES_PER_STEP
    )
    series = [
        {"step": step, mk.REWARD_ACCURACY: values.get(source_key)}
        for step, values in rows
        if isinstance(values.get(source_key), int | float) and math.isfinite(values.get(source_key))
    ]
    detector = detect_from_rows(series, CollapseConfig(), samples, samples)
    summary: dict[str, Any] = {
        "steps": run.current_step,
        "collapsed": bool(detector.collapsed),
        "collapse_step": detector.collapse_step,
        "collapse_reason": detector.collapse_reason,
        "collapse_metric": source_key,
    }
    return summary
