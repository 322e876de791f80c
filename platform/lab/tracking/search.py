"""MLflow's search, as MLflow defines it: filters and ``order_by`` are parsed and
applied by MLflow's own search utilities (``mlflow.utils.search_utils``, from
mlflow-skinny; the same code MLflow's file store searches with), over the lab's
runs and experiments turned into MLflow's entities. So every clause MLflow
takes works with its semantics: comparisons on metrics (the latest value),
params, tags and attributes, ``LIKE`` / ``ILIKE``, ``IN``, ``IS NULL``, dataset
clauses, ``!=`` that a run lacking the key never matches, ordering with
missing values last and MLflow's tie-break (start time, newest first, then run
id); a bad filter is MLflow's INVALID_PARAMETER_VALUE with MLflow's message.

mlflow is imported on the first search (about a second), not when the web
process starts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lab.experiments.models import Experiment
from lab.runs.models import Run, RunOrigin
from lab.tracking import shapes
from lab.tracking.errors import invalid
from lab.tracking.models import TrackedRun

ACTIVE_ONLY, DELETED_ONLY, ALL = 1, 2, 3
_VIEW_TYPES = {"ACTIVE_ONLY": ACTIVE_ONLY, "DELETED_ONLY": DELETED_ONLY, "ALL": ALL}


def view_type(value: Any) -> int:
    """MLflow's ViewType from a request (its name, as proto JSON sends it, or number)."""
    if value in (None, ""):
        return ACTIVE_ONLY
    if isinstance(value, str) and value.upper() in _VIEW_TYPES:
        return _VIEW_TYPES[value.upper()]
    if str(value) in ("1", "2", "3"):
        return int(value)
    raise invalid(f"Invalid value {value!r} for parameter 'run_view_type'")


def _mlflow_call(function, *args):
    """Call an mlflow search utility; its MlflowException is our INVALID_PARAMETER_VALUE
    with its message (what an MLflow server answers)."""
    from mlflow.exceptions import MlflowException

    try:
        return function(*args)
    except MlflowException as exc:
        raise invalid(exc.message) from None
    except (ValueError, TypeError, IndexError, AttributeError) as exc:
        raise invalid(f"Invalid search expression: {exc}") from None


def search_runs(
    experiment_ids: Sequence[int],
    filter_string: str,
    order_by: Sequence[str],
    run_view: int,
    page_token: str,
    max_results: int,
    status_of,
) -> tuple[list[tuple[Run, TrackedRun]], str | None]:
    """(a page of the matching external runs with their MLflow records, the next
    page's token or None). ``status_of(run)`` is MLflow's status of a lab run."""
    from mlflow.utils.search_utils import SearchUtils

    runs = Run.all_objects.filter(
        origin=RunOrigin.EXTERNAL, experiment_id__in=list(experiment_ids)
    ).select_related("owner")
    if run_view == ACTIVE_ONLY:
        runs = runs.filter(deleted_at__isnull=True)
    elif run_view == DELETED_ONLY:
        runs = runs.filter(deleted_at__isnull=False)
    runs = list(runs)
    tracked = {t.run_id: t for t in TrackedRun.objects.filter(run_id__in=[r.pk for r in runs])}
    by_id = {str(r.pk): (r, tracked[r.pk]) for r in runs if r.pk in tracked}
    entities = [_run_entity(run, record, status_of(run)) for run, record in by_id.values()]
    matching = _mlflow_call(SearchUtils.filter, entities, filter_string)
    ordered = _mlflow_call(SearchUtils.sort, matching, list(order_by))
    page, token = _mlflow_call(SearchUtils.paginate, ordered, page_token or None, max_results)
    return [by_id[e.info.run_id] for e in page], _token_text(token)


def search_experiments(
    filter_string: str,
    order_by: Sequence[str],
    view: int,
    page_token: str,
    max_results: int,
    tags_of,
) -> tuple[list[Experiment], str | None]:
    """(a page of the matching experiments, the next page's token or None);
    ``tags_of(ids)`` gives their MLflow tags."""
    from mlflow.entities import Experiment as MlflowExperiment
    from mlflow.entities import ExperimentTag
    from mlflow.utils.search_utils import SearchExperimentsUtils, SearchUtils

    experiments = Experiment.all_objects.all()
    if view == ACTIVE_ONLY:
        experiments = experiments.filter(deleted_at__isnull=True)
    elif view == DELETED_ONLY:
        experiments = experiments.filter(deleted_at__isnull=False)
    experiments = list(experiments)
    tags = tags_of([e.pk for e in experiments])
    by_id = {str(e.pk): e for e in experiments}
    entities = [
        MlflowExperiment(
            experiment_id=str(e.pk),
            name=e.name,
            artifact_location=shapes.experiment_artifact_root(e.pk),
            lifecycle_stage="deleted" if e.deleted_at else "active",
            tags=[ExperimentTag(k, v) for k, v in (tags.get(e.pk) or {}).items()],
            creation_time=shapes.ms(e.created_at),
            last_update_time=shapes.ms(e.updated_at),
        )
        for e in experiments
    ]
    # MLflow's default order: newest first, then the id
    order = list(order_by) or ["creation_time DESC"]
    matching = _mlflow_call(SearchExperimentsUtils.filter, entities, filter_string)
    ordered = _mlflow_call(SearchExperimentsUtils.sort, matching, order)
    page, token = _mlflow_call(SearchUtils.paginate, ordered, page_token or None, max_results)
    return [by_id[e.experiment_id] for e in page], _token_text(token)


def _token_text(token: bytes | str | None) -> str | None:
    if token is None:
        return None
    return token.decode() if isinstance(token, bytes) else token


def _run_entity(run: Run, tracked: TrackedRun, status: str):
    """An external run as MLflow's ``Run`` entity, what MLflow's search utilities read."""
    from mlflow.entities import (
        Dataset,
        DatasetInput,
        InputTag,
        Metric,
        Param,
        RunData,
        RunInfo,
        RunInputs,
        RunTag,
    )
    from mlflow.entities import Run as MlflowRun

    info = RunInfo(
        run_id=str(run.pk),
        experiment_id=str(run.experiment_id),
        user_id=run.owner.get_username(),
        status=status,
        start_time=tracked.start_time,
        end_time=tracked.end_time,
        lifecycle_stage="deleted" if run.deleted_at else "active",
        artifact_uri=shapes.run_artifact_uri(run),
        run_name=shapes.run_name(run, tracked),
    )
    metrics = [
        Metric(key, math.nan if value is None else value, timestamp, step)
        for key, (value, timestamp, step) in tracked.latest_metrics.items()
    ]
    params = [Param(k, str(v)) for k, v in ((run.config or {}).get("params") or {}).items()]
    data = RunData(
        metrics=metrics, params=params, tags=[RunTag(k, v) for k, v in tracked.tags.items()]
    )
    inputs = RunInputs(
        dataset_inputs=[
            DatasetInput(
                Dataset(
                    name=d.get("name", ""),
                    digest=d.get("digest", ""),
                    source_type=d.get("source_type", ""),
                    source=d.get("source", ""),
                    schema=d.get("schema"),
                    profile=d.get("profile"),
                ),
                tags=[InputTag(t.get("key", ""), t.get("value", "")) for t in e.get("tags") or []],
            )
            for e in tracked.inputs
            if isinstance(d := e.get("dataset") or {}, dict)
        ]
    )
    return MlflowRun(info, data, inputs)
