"""Writes of the MLflow tracking API (and the TensorBoard import) to external runs:
create, update, delete and restore, params, tags, metric points, dataset inputs and
model outputs. Each write is one transaction; a refusal (``MlflowError``) stores
nothing. Experiments: tracking/experiments.py.

An external run is a ``runs.Run`` with ``origin = external`` whose metrics go
into the lab's one metric store (``MetricStep``, a row per (run, step)), so
the charts, compare, the stability review and survival statistics read it
like a lab run; every point is also kept as it was logged (``MetricPoint``,
MLflow's metric history: tracking/points.py). Points are merged into the
step's row under the run's lock (``runs.metrics.seal.lock_run``, the lock
every metric write takes): a client that retries a batch writes the same
values again and adds nothing.

Grouping as MLflow clients express it, whenever the tags change (at
``start_run`` or later: transformers sets ``MLFLOW_TAGS`` after it): the
tag ``seed`` (or ``lab.seed``) is the run's seed, ``lab.variant`` (or
``variant``) its variant, else its run name; ``mlflow.parentRunId`` makes it
a nested run of that parent.

Status: MLflow's RUNNING / SCHEDULED -> running, FINISHED -> succeeded,
FAILED -> failed, KILLED -> cancelled. An external run never enters the
lab's queue (``queue = "external"``, never ``queued``) and has no heartbeat,
so the reconciler leaves it alone. When it ends, the lab's collapse rule
(trainer/analysis/collapse.py) runs over its stored accuracy and the outcome
is its summary, as a lab run's trainer writes it. ``runs/delete`` hides the
run (``Run.deleted_at``) until ``runs/restore``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from lab.experiments.rights import can_queue
from lab.runs.metrics.columns import chunk_of
from lab.runs.metrics.seal import lock_run_record, seal_metrics, unseal_from
from lab.runs.models import FINAL_STATUSES, MetricStep, Run, RunOrigin, RunStatus
from lab.tracking import metric_map
from lab.tracking.errors import PERMISSION_DENIED, MlflowError, invalid, missing
from lab.tracking.experiments import get_experiment, parse_id
from lab.tracking.models import TrackedRun
from lab.tracking.payload import Point
from lab.tracking.points import merge_into_steps, store_points
from trainer import metric_keys as mk
from trainer.analysis.collapse import detect_from_rows
from trainer.config import CollapseConfig

EXTERNAL_QUEUE = "external"
# Tags the lab reads (docs/integrations.md): the framework when its metric names do not
# say it, the answers per step the collapse rule's binomial noise assumes, grouping.
FRAMEWORK_TAG = "lab.framework"
HOST_TAG = "lab.host"
SAMPLES_TAG = "lab.samples_per_step"
SEED_TAGS = ("seed", "lab.seed")
VARIANT_TAGS = ("lab.variant", "variant")
RUN_NAME_TAG = "mlflow.runName"
PARENT_TAG = "mlflow.parentRunId"
DEFAULT_SAMPLES_PER_STEP = 128  # CollapseDetector's default
MAX_INPUTS = 1000  # dataset inputs kept per run
_NO_POINT = Point("", None, 0, 0)

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


def get_run(run_id: Any) -> tuple[Run, TrackedRun]:
    """An external run (a deleted one too: MLflow's get shows it as deleted) and its
    MLflow record; RESOURCE_DOES_NOT_EXIST for anything else."""
    pk = parse_id(run_id, "run_id")
    run = Run.all_objects.select_related("experiment", "owner").filter(pk=pk).first()
    tracked = TrackedRun.objects.filter(run_id=pk).first() if run is not None else None
    if run is None or tracked is None or run.origin != RunOrigin.EXTERNAL:
        raise missing(f"Run '{run_id}' not found")
    return run, tracked


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
    run_name = run_name or tag_map.get(RUN_NAME_TAG, "")
    if run_name:
        tag_map.setdefault(RUN_NAME_TAG, run_name)
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
            variant="",
            config={"model": {}, "params": {}},
            seed=0,
            status=RunStatus.RUNNING,
            queue=EXTERNAL_QUEUE,
            origin=RunOrigin.EXTERNAL,
            source=source,
            started_at=timezone.now(),
            heartbeat_at=timezone.now(),
            total_steps=1,
        )
        tracked = TrackedRun(
            run=run, tags=tag_map, start_time=start_time if start_time is not None else now_ms()
        )
        _group(run, tracked)
        run.save(update_fields=["variant", "seed"])
        tracked.save(force_insert=True)
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
            tracked.tags[RUN_NAME_TAG] = run_name
            _group(run, tracked)
            fields += ["variant", "seed"]
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
    """MLflow's DeleteRun: the run leaves every page (soft delete, ``Run.deleted_at``)
    and can be restored (the run's owner or staff, the lab's rule for deleting)."""
    _set_deleted(user, run_id, deleted=True)


def restore_run(*, user, run_id: Any) -> None:
    """MLflow's RestoreRun: a deleted run back where it was."""
    _set_deleted(user, run_id, deleted=False)


def _set_deleted(user, run_id: Any, *, deleted: bool) -> None:
    with transaction.atomic():
        run, tracked = _locked_for_write(user, run_id, deleted_ok=True)
        if run.experiment.deleted_at is not None and not deleted:
            raise invalid(
                f"run {run.pk}'s experiment {run.experiment_id} is deleted: restore it first"
            )
        now = timezone.now()
        run.deleted_at = now if deleted else None
        run.save(update_fields=["deleted_at"])
        tracked.deleted_time = int(now.timestamp() * 1000) if deleted else None
        tracked.save(update_fields=["deleted_time"])


def set_tag(*, user, run_id: Any, key: str, value: str) -> None:
    log_batch(user=user, run_id=run_id, tags=[(key, value)])


def delete_tag(*, user, run_id: Any, key: str) -> None:
    with transaction.atomic():
        run, tracked = _locked_for_write(user, run_id)
        if key not in tracked.tags:
            raise missing(f"No tag with name: {key} in run with id {run_id}")
        del tracked.tags[key]
        _group(run, tracked)
        run.save(update_fields=["variant", "seed"])
        tracked.save(update_fields=["tags", "parent"])


def log_batch(
    *,
    user,
    run_id: Any,
    metrics: Sequence[Point] = (),
    params: Sequence[tuple[str, str]] = (),
    tags: Sequence[tuple[str, str]] = (),
    lab_step: Callable[[str, int], int] | None = None,
) -> int:
    """MLflow's LogBatch (and LogMetric / LogParam / SetTag, batches of one), in one
    transaction: params (written once: a second value for a key is refused, the same
    value again is fine), tags, then the points (tracking/points.py; ``lab_step`` as
    there). Returns the points stored."""
    with transaction.atomic():
        run, tracked = _locked_for_write(user, run_id)
        if params:
            _log_params(run, params)
        if tags:
            tracked.tags.update(dict(tags))
            if _known(tracked.tags.get(FRAMEWORK_TAG)):
                run.source = {**run.source, "framework": tracked.tags[FRAMEWORK_TAG]}
            _group(run, tracked)
        model_before = dict(run.config.get("model") or {})
        stored = store_points(run, tracked, list(metrics), lab_step) if metrics else 0
        # Only what this batch can have changed: a run's config holds every param it
        # logged (hundreds for a transformers run), not to be encoded and rewritten by
        # every batch of points.
        changed = {"source"}
        if params or run.config.get("model") != model_before:
            changed.add("config")
        if metrics:
            changed |= {"current_step", "total_steps"}
        if tags:
            changed |= {"variant", "seed"}
        run.save(update_fields=sorted(changed))
        tracked.save(
            update_fields=["latest_metrics", "stored_as", *(["tags", "parent"] if tags else [])]
        )
        sealed_before = run.metric_chunks_sealed
    last = max(
        (p.step if lab_step is None else lab_step(p.key, p.step)) for p in metrics or [_NO_POINT]
    )
    if metrics and chunk_of(last) > sealed_before:
        # the run moved into a new chunk: the ones it left become columns (as the worker does)
        seal_metrics(run.pk)
    return stored


def log_inputs(*, user, run_id: Any, datasets: list[dict[str, Any]]) -> None:
    """MLflow's LogInputs: dataset inputs, one per (digest, name, context) as MLflow
    keeps them; the same input logged again changes nothing."""
    with transaction.atomic():
        _, tracked = _locked_for_write(user, run_id)
        seen = {_input_key(entry) for entry in tracked.inputs}
        for entry in datasets:
            if _input_key(entry) not in seen:
                tracked.inputs.append(entry)
                seen.add(_input_key(entry))
        if len(tracked.inputs) > MAX_INPUTS:
            raise invalid(f"a run keeps at most {MAX_INPUTS} dataset inputs")
        tracked.save(update_fields=["inputs"])


def log_outputs(*, user, run_id: Any, models: list[dict[str, Any]]) -> None:
    """MLflow 3's LogOutputs: the logged models a run produced (at a step)."""
    with transaction.atomic():
        _, tracked = _locked_for_write(user, run_id)
        for entry in models:
            if entry not in tracked.outputs:
                tracked.outputs.append(entry)
        tracked.save(update_fields=["outputs"])


def log_vectors(*, user, run_id: Any, by_step: dict[int, dict[str, list]]) -> None:
    """Whole vectors into the run's step rows (an imported histogram's expert loads or
    distribution: tracking/tensorboard.py); the run lists its distribution keys."""
    with transaction.atomic():
        run, tracked = _locked_for_write(user, run_id)
        merge_into_steps(run, by_step)
        run.save(update_fields=["config", "current_step", "total_steps", "metric_chunks_sealed"])
        keys = {k for values in by_step.values() for k in values}
        dists = sorted(
            set(tracked.distributions) | {k for k in keys if k.startswith(mk.DISTRIBUTION_PREFIX)}
        )
        if dists != tracked.distributions:
            tracked.distributions = dists
            tracked.save(update_fields=["distributions"])


def forget_metrics(*, user, run_id: Any, names: list[str]) -> None:
    """Take the values stored for these logged names out of the run's step rows (their
    points stay as logged): an import re-reads them onto other steps. Rows left empty
    go; the run's columns are rebuilt from the rows when it is sealed again."""
    with transaction.atomic():
        run, tracked = _locked_for_write(user, run_id)
        keys = {tracked.stored_as.get(n, n) for n in names}
        changed, emptied = [], []
        for row in MetricStep.objects.filter(run_id=run.pk).order_by("step"):
            if keys & set(row.values):
                row.values = {k: v for k, v in row.values.items() if k not in keys}
                (changed if row.values else emptied).append(row)
        MetricStep.objects.bulk_update(changed, ["values"], batch_size=500)
        MetricStep.objects.filter(pk__in=[r.pk for r in emptied]).delete()
        if changed or emptied:
            unseal_from(run.pk, 0)
        run.current_step = MetricStep.objects.filter(run_id=run.pk).count()
        run.save(update_fields=["current_step"])


def set_source(*, user, run_id: Any, **fields: Any) -> None:
    """Add facts about where the run came from (``Run.source``)."""
    with transaction.atomic():
        run, _ = _locked_for_write(user, run_id)
        run.source = {**run.source, **fields}
        run.save(update_fields=["source"])


def set_import_notes(*, user, run_id: Any, notes: list[dict[str, Any]]) -> None:
    """What an import could not store, one line per tag with the reason."""
    with transaction.atomic():
        _, tracked = _locked_for_write(user, run_id)
        if tracked.import_notes != notes:
            tracked.import_notes = notes
            tracked.save(update_fields=["import_notes"])


def _input_key(entry: Mapping[str, Any]) -> tuple:
    dataset = entry.get("dataset") or {}
    context = [
        t.get("value") for t in entry.get("tags") or [] if t.get("key") == "mlflow.data.context"
    ]
    return dataset.get("name"), dataset.get("digest"), tuple(context)


# --------------------------------------------------------------------------- internals


def _known(framework: Any) -> bool:
    return isinstance(framework, str) and framework in metric_map.FRAMEWORKS


def _group(run: Run, tracked: TrackedRun) -> None:
    """Seed, variant and parent from the run's tags (the module docstring)."""
    tags = tracked.tags
    seed_text = next((tags[t] for t in SEED_TAGS if tags.get(t)), "")
    run.seed = (
        int(seed_text) if seed_text.isascii() and seed_text.isdigit() and len(seed_text) < 10 else 0
    )
    variant = next((tags[t] for t in VARIANT_TAGS if tags.get(t)), "") or tags.get(RUN_NAME_TAG, "")
    run.variant = variant[:200]
    parent = tags.get(PARENT_TAG, "")
    parent_pk = int(parent) if parent.isascii() and parent.isdigit() and len(parent) < 18 else None
    if (
        parent_pk is not None
        and parent_pk != run.pk
        and Run.all_objects.filter(pk=parent_pk).exists()
    ):
        tracked.parent_id = parent_pk
    else:
        tracked.parent_id = None


def _locked_for_write(user, run_id: Any, *, deleted_ok: bool = False) -> tuple[Run, TrackedRun]:
    """Inside a transaction: the external run, row-locked (the metric store's lock), after
    the rights check: its owner or staff write to it; a deleted run takes no writes
    but its restore (MLflow: "must be in the 'active' state")."""
    pk = parse_id(run_id, "run_id")
    # Read under the lock: what is read is what no other writer changes meanwhile.
    # Not the experiment: its base config is a whole resolved config to decode per batch.
    run = lock_run_record(pk)
    tracked = TrackedRun.objects.filter(run_id=pk).first() if run is not None else None
    if run is None or tracked is None or run.origin != RunOrigin.EXTERNAL:
        raise missing(f"Run '{run_id}' not found")
    if not run.can_manage(user):
        raise MlflowError(
            PERMISSION_DENIED, f"only the owner of run {run.pk} or staff can write to it"
        )
    if run.deleted_at is not None and not deleted_ok:
        raise invalid(f"The run {run.pk} must be in the 'active' state. Current state is deleted.")
    # Every write is a sign of life: the run's last contact, and a run marked lost
    # (silent past LAB_EXTERNAL_LOST_AFTER_S) that reports again is running again.
    now = timezone.now()
    revived = {"status": RunStatus.RUNNING, "error": ""} if run.status == RunStatus.LOST else {}
    Run.all_objects.filter(pk=run.pk).update(heartbeat_at=now, **revived)
    run.heartbeat_at = now
    for field, value in revived.items():
        setattr(run, field, value)
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
    its accuracy); the reason names the metric judged."""
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
    detector = detect_from_rows(series, CollapseConfig(), samples, samples, metric=source_key)
    return {
        "steps": run.current_step,
        "judged_steps": len(series),
        "collapsed": bool(detector.collapsed),
        "collapse_step": detector.collapse_step,
        "collapse_reason": detector.collapse_reason,
        "collapse_metric": source_key,
    }
