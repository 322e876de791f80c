"""The JSON shapes of MLflow's ``service.proto`` for the lab's experiments, external
runs and logged models, as the MLflow clients read them. Artifact locations are
MLflow's proxied ones (``mlflow-artifacts:``), which the clients resolve against
the tracking URI to the lab's artifact endpoints (tracking/artifact_views.py)."""

from __future__ import annotations

from typing import Any

from lab.experiments.models import Experiment
from lab.runs.models import Run
from lab.tracking.models import LoggedModel, TrackedRun

ARTIFACT_SCHEME = "mlflow-artifacts:"


def ms(dt) -> int | None:
    return int(dt.timestamp() * 1000) if dt is not None else None


def kv(mapping: dict[str, Any]) -> list[dict[str, str]]:
    return [{"key": k, "value": str(v)} for k, v in sorted(mapping.items())]


def experiment_artifact_root(experiment_id: int) -> str:
    return f"{ARTIFACT_SCHEME}/{experiment_id}"


def run_artifact_uri(run: Run) -> str:
    return f"{ARTIFACT_SCHEME}/{run.experiment_id}/{run.pk}/artifacts"


def model_artifact_uri(model: LoggedModel) -> str:
    return f"{ARTIFACT_SCHEME}/{model.experiment_id}/models/{model.model_id}/artifacts"


def experiment_json(experiment: Experiment, tags: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "experiment_id": str(experiment.pk),
        "name": experiment.name,
        "artifact_location": experiment_artifact_root(experiment.pk),
        "lifecycle_stage": "deleted" if experiment.deleted_at else "active",
        "creation_time": ms(experiment.created_at),
        "last_update_time": ms(experiment.updated_at),
        "tags": kv(tags or {}),
    }


def run_name(run: Run, tracked: TrackedRun) -> str:
    return tracked.tags.get("mlflow.runName") or run.variant


def run_info_json(run: Run, tracked: TrackedRun, status: str) -> dict[str, Any]:
    info = {
        "run_id": str(run.pk),
        "run_uuid": str(run.pk),
        "run_name": run_name(run, tracked),
        "experiment_id": str(run.experiment_id),
        "user_id": run.owner.get_username(),
        "status": status,
        "start_time": tracked.start_time,
        "artifact_uri": run_artifact_uri(run),
        "lifecycle_stage": "deleted" if run.deleted_at else "active",
    }
    if tracked.end_time is not None:
        info["end_time"] = tracked.end_time
    return info


def run_json(run: Run, tracked: TrackedRun, status: str) -> dict[str, Any]:
    metrics = [
        {
            "key": key,
            "value": "NaN" if value is None else value,
            "timestamp": timestamp,
            "step": step,
        }
        for key, (value, timestamp, step) in sorted(tracked.latest_metrics.items())
    ]
    return {
        "info": run_info_json(run, tracked, status),
        "data": {
            "metrics": metrics,
            "params": kv((run.config or {}).get("params") or {}),
            "tags": kv(tracked.tags),
        },
        "inputs": {"dataset_inputs": list(tracked.inputs), "model_inputs": []},
        "outputs": {"model_outputs": list(tracked.outputs)},
    }


def logged_model_json(model: LoggedModel) -> dict[str, Any]:
    info = {
        "model_id": model.model_id,
        "experiment_id": str(model.experiment_id),
        "name": model.name,
        "creation_timestamp_ms": model.created_ms,
        "last_updated_timestamp_ms": model.updated_ms,
        "artifact_uri": model_artifact_uri(model),
        "status": model.status,
        "model_type": model.model_type,
        "tags": kv(model.tags),
    }
    if model.status_message:
        info["status_message"] = model.status_message
    if model.source_run_id is not None:
        info["source_run_id"] = str(model.source_run_id)
    data: dict[str, Any] = {}
    if model.params:
        data["params"] = kv(model.params)
    if model.metrics:
        data["metrics"] = list(model.metrics)
    return {"info": info, "data": data}
