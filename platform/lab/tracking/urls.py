"""The MLflow REST API under the paths MLflow clients call: ``/api/2.0/mlflow/...``
(the Python, Java and R clients) and ``/ajax-api/2.0/mlflow/...`` (MLflow's web UI
and some JavaScript clients), the artifact API under ``/api/2.0/mlflow-artifacts/``,
and MLflow 3's ``/api/3.0/mlflow/server-info``. Anything else under those
prefixes is an ENDPOINT_NOT_FOUND in MLflow's error shape."""

from django.urls import path

from lab.tracking import artifact_views, model_views, tensorboard_views, views
from lab.tracking.http import not_found

ENDPOINTS = {
    "experiments/create": views.experiments_create,
    "experiments/get": views.experiments_get,
    "experiments/get-by-name": views.experiments_get_by_name,
    "experiments/search": views.experiments_search,
    "experiments/update": views.experiments_update,
    "experiments/delete": views.experiments_delete,
    "experiments/restore": views.experiments_restore,
    "experiments/set-experiment-tag": views.experiments_set_tag,
    "experiments/delete-experiment-tag": views.experiments_delete_tag,
    "runs/create": views.runs_create,
    "runs/get": views.runs_get,
    "runs/update": views.runs_update,
    "runs/delete": views.runs_delete,
    "runs/restore": views.runs_restore,
    "runs/search": views.runs_search,
    "runs/log-batch": views.runs_log_batch,
    "runs/log-metric": views.runs_log_metric,
    "runs/log-parameter": views.runs_log_parameter,
    "runs/set-tag": views.runs_set_tag,
    "runs/delete-tag": views.runs_delete_tag,
    "runs/log-inputs": views.runs_log_inputs,
    "runs/outputs": views.runs_log_outputs,
    "metrics/get-history": views.metrics_get_history,
    "artifacts/list": artifact_views.run_artifact_list,
    "logged-models": model_views.logged_models_create,
    "logged-models/search": model_views.logged_models_search,
    "logged-models/<str:model_id>": model_views.logged_model,
    "logged-models/<str:model_id>/tags": model_views.logged_model_tags,
    "logged-models/<str:model_id>/tags/<path:tag_key>": model_views.logged_model_tag,
    "logged-models/<str:model_id>/params": model_views.logged_model_params,
    "logged-models/<str:model_id>/artifacts/directories": artifact_views.model_artifact_directories,
    "registered-models/create": model_views.registered_models_create,
    "registered-models/get": model_views.registered_models_get,
    "registered-models/rename": model_views.registered_models_rename,
    "registered-models/update": model_views.registered_models_update,
    "registered-models/delete": model_views.registered_models_delete,
    "registered-models/search": model_views.registered_models_search,
    "registered-models/get-latest-versions": model_views.registered_models_latest_versions,
    "registered-models/set-tag": model_views.registered_models_set_tag,
    "registered-models/delete-tag": model_views.registered_models_delete_tag,
    "registered-models/alias": model_views.registered_models_alias,
    "model-versions/create": model_views.model_versions_create,
    "model-versions/get": model_views.model_versions_get,
    "model-versions/update": model_views.model_versions_update,
    "model-versions/delete": model_views.model_versions_delete,
    "model-versions/search": model_views.model_versions_search,
    "model-versions/transition-stage": model_views.model_versions_transition_stage,
    "model-versions/set-tag": model_views.model_versions_set_tag,
    "model-versions/delete-tag": model_views.model_versions_delete_tag,
    "model-versions/get-download-uri": model_views.model_versions_download_uri,
}

PREFIXES = ("api/2.0/mlflow/", "ajax-api/2.0/mlflow/")
ARTIFACT_PREFIXES = ("api/2.0/mlflow-artifacts/", "ajax-api/2.0/mlflow-artifacts/")


def _name(prefix: str, route: str) -> str:
    return "mlflow-" + (prefix + route).replace("/", "-").replace("<", "").replace(">", "").replace(
        ":", "-"
    )


urlpatterns = [
    *[
        path(f"{prefix}{route}", view, name=_name(prefix, route))
        for prefix in PREFIXES
        for route, view in ENDPOINTS.items()
    ],
    *[
        p
        for prefix in ARTIFACT_PREFIXES
        for p in (
            path(f"{prefix}artifacts", artifact_views.artifact_list, name=_name(prefix, "list")),
            path(
                f"{prefix}artifacts/<path:artifact_path>",
                artifact_views.artifact,
                name=_name(prefix, "artifact"),
            ),
        )
    ],
    path("api/3.0/mlflow/server-info", views.server_info, name="mlflow-server-info"),
    # the lab's own endpoint beside MLflow's: TensorBoard event files of a run
    path(
        "api/tracking/tensorboard",
        tensorboard_views.tensorboard_import,
        name="tracking-tensorboard",
    ),
    path(
        "api/tracking/tensorboard/status",
        tensorboard_views.tensorboard_import_status,
        name="tracking-tensorboard-status",
    ),
    *[path(f"{prefix}<path:rest>", not_found) for prefix in (*PREFIXES, *ARTIFACT_PREFIXES)],
]
