"""The MLflow tracking API under the paths MLflow clients call: ``/api/2.0/mlflow/...``
(the Python, Java and R clients) and ``/ajax-api/2.0/mlflow/...`` (MLflow's web UI
and some JavaScript clients). Anything else under those prefixes is an
ENDPOINT_NOT_FOUND in MLflow's error shape."""

from django.urls import path

from lab.tracking import views

ENDPOINTS = {
    "experiments/create": views.experiments_create,
    "experiments/get": views.experiments_get,
    "experiments/get-by-name": views.experiments_get_by_name,
    "experiments/search": views.experiments_search,
    "runs/create": views.runs_create,
    "runs/get": views.runs_get,
    "runs/update": views.runs_update,
    "runs/delete": views.runs_delete,
    "runs/search": views.runs_search,
    "runs/log-batch": views.runs_log_batch,
    "runs/log-metric": views.runs_log_metric,
    "runs/log-parameter": views.runs_log_parameter,
    "runs/set-tag": views.runs_set_tag,
    "runs/delete-tag": views.runs_delete_tag,
    "metrics/get-history": views.metrics_get_history,
}

PREFIXES = ("api/2.0/mlflow/", "ajax-api/2.0/mlflow/")

urlpatterns = [
    path(f"{prefix}{route}", view, name=f"mlflow-{i}-{route.replace('/', '-')}")
    for i, prefix in enumerate(PREFIXES)
    for route, view in ENDPOINTS.items()
] + [
    # the lab's own endpoint beside MLflow's: TensorBoard event files of a run
    path("api/tracking/tensorboard", views.tensorboard_import, name="tracking-tensorboard"),
    *[path(f"{prefix}<path:rest>", views.not_found) for prefix in PREFIXES],
]
