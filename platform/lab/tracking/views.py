"""The MLflow tracking REST API (``/api/2.0/mlflow/...``, and the same under
``/ajax-api/2.0/mlflow/...``), the part MLflow clients use to log and find runs:
the request and response shapes of MLflow's ``service.proto`` as JSON. Views
read and check the request (tracking/payload.py) and call the services; every
refusal is MLflow's error JSON (tracking/errors.py), never a 500
(tracking/http.py). Artifacts: tracking/artifact_views.py; logged models and
the registry: tracking/model_views.py.
"""

from __future__ import annotations

from typing import Any

from lab.tracking import experiments, history, payload, search, services
from lab.tracking.errors import invalid
from lab.tracking.http import endpoint, next_token, page, run_id_of, string_list
from lab.tracking.shapes import experiment_json, run_info_json, run_json

MAX_RUNS_PER_PAGE = 50000  # MLflow's SEARCH_MAX_RESULTS_THRESHOLD
DEFAULT_RUNS_PER_PAGE = 1000
MAX_EXPERIMENTS_PER_PAGE = 50000
MAX_HISTORY_PER_PAGE = 25000  # MLflow's GET_METRIC_HISTORY_MAX_RESULTS
MAX_FILTER_LENGTH = 10000


def _status(run) -> str:
    return services.LAB_TO_MLFLOW_STATUS[run.status]


def _run(run, tracked) -> dict[str, Any]:
    return run_json(run, tracked, _status(run))


def _experiment(experiment) -> dict[str, Any]:
    tags = experiments.experiment_tags([experiment.pk]).get(experiment.pk)
    return experiment_json(experiment, tags)


def _text(body, field: str, max_length: int = MAX_FILTER_LENGTH) -> str:
    return payload.text(body, field, max_length=max_length, required=False, any_text=True)


# --------------------------------------------------------------------------- experiments


@endpoint("POST")
def experiments_create(request, user, body):
    name = payload.text(body, "name", max_length=payload.MAX_EXPERIMENT_NAME_LENGTH).strip()
    if len(name) > 200:  # the lab's Experiment.name
        raise invalid(f"Invalid experiment name: at most 200 characters ({len(name)} given)")
    tags = payload.pairs(body.get("tags"), "tags", max_value_length=payload.MAX_TAG_VAL_LENGTH)
    experiment = experiments.create_experiment(user=user, name=name, tags=dict(tags))
    return {"experiment_id": str(experiment.pk)}


@endpoint("GET")
def experiments_get(request, user, body):
    experiment = experiments.get_experiment(body.get("experiment_id"), user, deleted=True)
    return {"experiment": _experiment(experiment)}


@endpoint("GET")
def experiments_get_by_name(request, user, body):
    name = payload.text(body, "experiment_name", max_length=payload.MAX_EXPERIMENT_NAME_LENGTH)
    return {"experiment": _experiment(experiments.get_experiment_by_name(name, user))}


@endpoint("GET", "POST")
def experiments_search(request, user, body):
    limit = payload.integer(
        body, "max_results", default=DEFAULT_RUNS_PER_PAGE, lo=1, hi=MAX_EXPERIMENTS_PER_PAGE
    )
    found, token = search.search_experiments(
        _text(body, "filter"),
        string_list(body, "order_by", most=100),
        search.view_type(body.get("view_type")),
        _text(body, "page_token", 1000),
        limit,
        experiments.experiment_tags,
    )
    tags = experiments.experiment_tags([e.pk for e in found])
    answer: dict[str, Any] = {"experiments": [experiment_json(e, tags.get(e.pk)) for e in found]}
    if token:
        answer["next_page_token"] = token
    return answer


@endpoint("POST")
def experiments_update(request, user, body):
    new_name = payload.text(body, "new_name", max_length=payload.MAX_EXPERIMENT_NAME_LENGTH)
    experiments.rename_experiment(
        user=user, experiment_id=body.get("experiment_id"), new_name=new_name
    )
    return {}


@endpoint("POST")
def experiments_delete(request, user, body):
    experiments.delete_experiment(user=user, experiment_id=body.get("experiment_id"))
    return {}


@endpoint("POST")
def experiments_restore(request, user, body):
    experiments.restore_experiment(user=user, experiment_id=body.get("experiment_id"))
    return {}


@endpoint("POST")
def experiments_set_tag(request, user, body):
    ((key, value),) = payload.pairs(
        [{"key": body.get("key"), "value": body.get("value")}],
        "tag",
        max_value_length=payload.MAX_TAG_VAL_LENGTH,
    )
    experiments.set_experiment_tag(
        user=user, experiment_id=body.get("experiment_id"), key=key, value=value
    )
    return {}


@endpoint("POST")
def experiments_delete_tag(request, user, body):
    key = payload.entity_key(body.get("key"), "key")
    experiments.delete_experiment_tag(user=user, experiment_id=body.get("experiment_id"), key=key)
    return {}


# --------------------------------------------------------------------------- runs


@endpoint("POST")
def runs_create(request, user, body):
    tags = payload.pairs(body.get("tags"), "tags", max_value_length=payload.MAX_TAG_VAL_LENGTH)
    if len(tags) > payload.MAX_PARAMS_TAGS_PER_BATCH:
        raise invalid(f"A run is created with at most {payload.MAX_PARAMS_TAGS_PER_BATCH} tags")
    run, tracked = services.create_run(
        user=user,
        experiment_id=body.get("experiment_id"),
        run_name=payload.text(
            body, "run_name", max_length=payload.MAX_RUN_NAME_LENGTH, required=False
        ),
        start_time=payload.integer(body, "start_time", lo=0, hi=payload.MAX_TIMESTAMP_MS),
        tags=tags,
        client=request.META.get("HTTP_USER_AGENT", "")[:200],
        remote_host=request.META.get("REMOTE_ADDR", "")[:200],
    )
    return {"run": _run(run, tracked)}


@endpoint("GET")
def runs_get(request, user, body):
    run, tracked = services.get_run(run_id_of(body))
    return {"run": _run(run, tracked)}


@endpoint("POST")
def runs_update(request, user, body):
    run, tracked = services.update_run(
        user=user,
        run_id=run_id_of(body),
        status=payload.text(body, "status", max_length=20, required=False),
        end_time=payload.integer(body, "end_time", lo=0, hi=payload.MAX_TIMESTAMP_MS),
        run_name=payload.text(
            body, "run_name", max_length=payload.MAX_RUN_NAME_LENGTH, required=False
        ),
    )
    return {"run_info": run_info_json(run, tracked, _status(run))}


@endpoint("POST")
def runs_delete(request, user, body):
    services.delete_run(user=user, run_id=run_id_of(body))
    return {}


@endpoint("POST")
def runs_restore(request, user, body):
    services.restore_run(user=user, run_id=run_id_of(body))
    return {}


@endpoint("GET", "POST")
def runs_search(request, user, body):
    ids = string_list(body, "experiment_ids")
    experiment_pks = [experiments.get_experiment(i, user, deleted=True).pk for i in ids]
    limit = payload.integer(
        body, "max_results", default=DEFAULT_RUNS_PER_PAGE, lo=1, hi=MAX_RUNS_PER_PAGE
    )
    found, token = search.search_runs(
        experiment_pks,
        _text(body, "filter"),
        string_list(body, "order_by", most=100),
        search.view_type(body.get("run_view_type")),
        _text(body, "page_token", 1000),
        limit,
        _status,
    )
    answer: dict[str, Any] = {"runs": [_run(r, t) for r, t in found]}
    if token:
        answer["next_page_token"] = token
    return answer


def _points(entries: Any) -> list[payload.Point]:
    if isinstance(entries, list) and len(entries) > payload.MAX_METRICS_PER_BATCH:
        raise invalid(
            f"A batch logging request can contain at most {payload.MAX_METRICS_PER_BATCH} "
            f"metrics. Got {len(entries)} metrics."
        )
    return payload.points(entries)


@endpoint("GET")
def metrics_get_history(request, user, body):
    key = payload.text(body, "metric_key", max_length=payload.MAX_ENTITY_KEY_LENGTH)
    offset, limit = page(body, MAX_HISTORY_PER_PAGE, MAX_HISTORY_PER_PAGE)
    run, tracked = services.get_run(run_id_of(body))
    points, total = history.metric_history(run.pk, tracked, key, offset, limit)
    return {"metrics": points, **next_token(offset, limit, total)}


@endpoint("POST")
def runs_log_batch(request, user, body):
    metrics = _points(body.get("metrics"))
    params = payload.pairs(
        body.get("params"), "params", max_value_length=payload.MAX_PARAM_VAL_LENGTH
    )
    tags = payload.pairs(body.get("tags"), "tags", max_value_length=payload.MAX_TAG_VAL_LENGTH)
    for field, entries in (("params", params), ("tags", tags)):
        if len(entries) > payload.MAX_PARAMS_TAGS_PER_BATCH:
            raise invalid(
                f"A batch logging request can contain at most "
                f"{payload.MAX_PARAMS_TAGS_PER_BATCH} {field}. Got {len(entries)} {field}."
            )
    if len(metrics) + len(params) + len(tags) > payload.MAX_ENTITIES_PER_BATCH:
        raise invalid(
            f"A batch logging request can contain at most {payload.MAX_ENTITIES_PER_BATCH} "
            "metrics, params and tags in total."
        )
    if len({k for k, _ in params}) != len(params):
        duplicated = {k: v for k, v in params}
        if any(duplicated[k] != v for k, v in params):
            raise invalid("Duplicate parameter keys with different values in one batch.")
    services.log_batch(user=user, run_id=run_id_of(body), metrics=metrics, params=params, tags=tags)
    return {}


@endpoint("POST")
def runs_log_metric(request, user, body):
    point = payload.point(body, "metric")
    services.log_batch(user=user, run_id=run_id_of(body), metrics=[point])
    return {}


@endpoint("POST")
def runs_log_parameter(request, user, body):
    (param,) = payload.pairs(
        [{"key": body.get("key"), "value": body.get("value")}],
        "param",
        max_value_length=payload.MAX_PARAM_VAL_LENGTH,
    )
    services.log_batch(user=user, run_id=run_id_of(body), params=[param])
    return {}


@endpoint("POST")
def runs_set_tag(request, user, body):
    (tag,) = payload.pairs(
        [{"key": body.get("key"), "value": body.get("value")}],
        "tag",
        max_value_length=payload.MAX_TAG_VAL_LENGTH,
    )
    services.set_tag(user=user, run_id=run_id_of(body), key=tag[0], value=tag[1])
    return {}


@endpoint("POST")
def runs_delete_tag(request, user, body):
    key = payload.entity_key(body.get("key"), "key")
    services.delete_tag(user=user, run_id=run_id_of(body), key=key)
    return {}


@endpoint("POST")
def runs_log_inputs(request, user, body):
    services.log_inputs(
        user=user, run_id=run_id_of(body), datasets=payload.dataset_inputs(body.get("datasets"))
    )
    return {}


@endpoint("POST")
def runs_log_outputs(request, user, body):
    services.log_outputs(
        user=user, run_id=run_id_of(body), models=payload.model_outputs(body.get("models"))
    )
    return {}


@endpoint("GET")
def server_info(request, user, body):
    """MLflow 3's capability probe (``/api/3.0/mlflow/server-info``)."""
    return {
        "store_type": "SqlStore",
        "workspaces_enabled": False,
        "trace_archival_enabled": False,
        "multipart_uploads_enabled": False,
        "multipart_downloads_enabled": False,
        "presigned_upload_run_id_supported": False,
        "presigned_upload_model_id_supported": False,
        "features_enabled": {"gateway": False},
    }
