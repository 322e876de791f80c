"""MLflow 3's logged-model endpoints and the model registry's, in MLflow's request and
response shapes (services: tracking/logged_models.py, tracking/registry.py)."""

from __future__ import annotations

from typing import Any

from lab.tracking import experiments, logged_models, payload, registry
from lab.tracking.errors import invalid, missing
from lab.tracking.http import endpoint, string_list
from lab.tracking.shapes import logged_model_json

MAX_MODELS_PER_PAGE = 50000


def _pairs(body, field: str) -> list[tuple[str, str]]:
    return payload.pairs(body.get(field), field, max_value_length=payload.MAX_TAG_VAL_LENGTH)


def _name(body, field: str = "name") -> str:
    return payload.text(body, field, max_length=payload.MAX_ENTITY_KEY_LENGTH, any_text=True)


def _optional(body, field: str, max_length: int = 50000) -> str | None:
    if body.get(field) is None:
        return None
    return payload.text(body, field, max_length=max_length, required=False, any_text=True)


def _limit(body, default: int) -> int:
    return payload.integer(body, "max_results", default=default, lo=1, hi=MAX_MODELS_PER_PAGE)


def _search_args(body) -> tuple[str, list[str], str]:
    """A search request's filter, order_by list and page token."""
    return (
        payload.text(body, "filter", max_length=10000, required=False, any_text=True),
        string_list(body, "order_by", most=100),
        payload.text(body, "page_token", max_length=1000, required=False, any_text=True),
    )


def _paged(key: str, items: list, token: str | None) -> dict[str, Any]:
    answer: dict[str, Any] = {key: items}
    if token:
        answer["next_page_token"] = token
    return answer


# --------------------------------------------------------------------------- logged models


@endpoint("POST")
def logged_models_create(request, user, body):
    model = logged_models.create_model(
        user=user,
        experiment_id=body.get("experiment_id"),
        name=payload.text(body, "name", max_length=500, required=False, any_text=True),
        model_type=payload.text(body, "model_type", max_length=500, required=False, any_text=True),
        source_run_id=body.get("source_run_id"),
        params=_pairs(body, "params"),
        tags=_pairs(body, "tags"),
    )
    return {"model": logged_model_json(model)}


@endpoint("GET", "PATCH", "DELETE")
def logged_model(request, user, body, model_id: str):
    if request.method == "PATCH":
        model = logged_models.finalize(user=user, model_id=model_id, status=body.get("status"))
        return {"model": logged_model_json(model)}
    if request.method == "DELETE":
        logged_models.delete_model(user=user, model_id=model_id)
        return {}
    return {"model": logged_model_json(logged_models.get_model(model_id))}


@endpoint("PATCH")
def logged_model_tags(request, user, body, model_id: str):
    logged_models.set_tags(user=user, model_id=model_id, tags=_pairs(body, "tags"))
    return {"model": logged_model_json(logged_models.get_model(model_id))}


@endpoint("DELETE")
def logged_model_tag(request, user, body, model_id: str, tag_key: str):
    logged_models.delete_tag(user=user, model_id=model_id, key=tag_key)
    return {}


@endpoint("POST")
def logged_model_params(request, user, body, model_id: str):
    params = payload.pairs(
        body.get("params"), "params", max_value_length=payload.MAX_PARAM_VAL_LENGTH
    )
    logged_models.log_params(user=user, model_id=model_id, params=params)
    return {}


@endpoint("POST", "GET")
def logged_models_search(request, user, body):
    ids = string_list(body, "experiment_ids")
    pks = [experiments.get_experiment(i, user, deleted=True).pk for i in ids]
    order_by = body.get("order_by") or []
    if not isinstance(order_by, list) or not all(isinstance(o, dict) for o in order_by):
        raise invalid("Invalid value for parameter 'order_by': a list of objects")
    found, token = logged_models.search_models(
        experiment_ids=pks,
        filter_string=payload.text(body, "filter", max_length=10000, required=False, any_text=True),
        order_by=order_by,
        page_token=payload.text(body, "page_token", max_length=1000, required=False, any_text=True),
        max_results=_limit(body, logged_models.DEFAULT_SEARCH_RESULTS),
    )
    return _paged("models", [logged_model_json(m) for m in found], token)


# --------------------------------------------------------------------------- registry


@endpoint("POST")
def registered_models_create(request, user, body):
    model = registry.create_model(
        user=user,
        name=_name(body),
        description=_optional(body, "description") or "",
        tags=_pairs(body, "tags"),
    )
    return {"registered_model": registry.model_json(model)}


@endpoint("GET")
def registered_models_get(request, user, body):
    return {"registered_model": registry.model_json(registry.get_model(_name(body)))}


@endpoint("POST")
def registered_models_rename(request, user, body):
    model = registry.update_model(user=user, name=_name(body), new_name=_name(body, "new_name"))
    return {"registered_model": registry.model_json(model)}


@endpoint("PATCH")
def registered_models_update(request, user, body):
    model = registry.update_model(
        user=user, name=_name(body), description=_optional(body, "description")
    )
    return {"registered_model": registry.model_json(model)}


@endpoint("DELETE")
def registered_models_delete(request, user, body):
    registry.delete_model(user=user, name=_name(body))
    return {}


@endpoint("GET", "POST")
def registered_models_search(request, user, body):
    found, token = registry.search_models(*_search_args(body), _limit(body, 100))
    return _paged("registered_models", [registry.model_json(m) for m in found], token)


@endpoint("GET", "POST")
def registered_models_latest_versions(request, user, body):
    model = registry.get_model(_name(body))
    versions = registry.latest_versions(model, string_list(body, "stages", most=10))
    return {"model_versions": [registry.version_json(mv) for mv in versions]}


@endpoint("POST")
def registered_models_set_tag(request, user, body):
    registry.set_model_tag(
        user=user,
        name=_name(body),
        key=_name(body, "key"),
        value=payload.text(
            body, "value", max_length=payload.MAX_TAG_VAL_LENGTH, required=False, any_text=True
        ),
    )
    return {}


@endpoint("DELETE")
def registered_models_delete_tag(request, user, body):
    registry.set_model_tag(user=user, name=_name(body), key=_name(body, "key"), value=None)
    return {}


@endpoint("POST", "DELETE", "GET")
def registered_models_alias(request, user, body):
    name, alias = _name(body), _name(body, "alias")
    if request.method == "GET":
        model = registry.get_model(name)
        if alias not in model.aliases:
            raise missing(f"Registered model alias {alias} not found.")
        mv = registry.get_version(name, model.aliases[alias])
        return {"model_version": registry.version_json(mv)}
    version = body.get("version") if request.method == "POST" else None
    registry.set_alias(user=user, name=name, alias=alias, version=version)
    return {}


@endpoint("POST")
def model_versions_create(request, user, body):
    mv = registry.create_version(
        user=user,
        name=_name(body),
        source=payload.text(body, "source", max_length=1000, any_text=True),
        run_id=body.get("run_id"),
        model_id=payload.text(body, "model_id", max_length=40, required=False),
        run_link=payload.text(body, "run_link", max_length=500, required=False, any_text=True),
        description=_optional(body, "description") or "",
        tags=_pairs(body, "tags"),
    )
    return {"model_version": registry.version_json(mv)}


@endpoint("GET")
def model_versions_get(request, user, body):
    return {
        "model_version": registry.version_json(
            registry.get_version(_name(body), body.get("version"))
        )
    }


@endpoint("PATCH")
def model_versions_update(request, user, body):
    mv = registry.update_version(
        user=user,
        name=_name(body),
        version=body.get("version"),
        description=_optional(body, "description"),
    )
    return {"model_version": registry.version_json(mv)}


@endpoint("POST")
def model_versions_transition_stage(request, user, body):
    archive = body.get("archive_existing_versions", False)
    if not isinstance(archive, bool):
        raise invalid("Invalid value for parameter 'archive_existing_versions': true or false")
    mv = registry.update_version(
        user=user,
        name=_name(body),
        version=body.get("version"),
        stage=payload.text(body, "stage", max_length=20),
        archive_existing=archive,
    )
    return {"model_version": registry.version_json(mv)}


@endpoint("DELETE")
def model_versions_delete(request, user, body):
    registry.delete_version(user=user, name=_name(body), version=body.get("version"))
    return {}


@endpoint("GET", "POST")
def model_versions_search(request, user, body):
    found, token = registry.search_versions(*_search_args(body), _limit(body, 10000))
    return _paged("model_versions", [registry.version_json(mv) for mv in found], token)


@endpoint("POST")
def model_versions_set_tag(request, user, body):
    registry.set_version_tag(
        user=user,
        name=_name(body),
        version=body.get("version"),
        key=_name(body, "key"),
        value=payload.text(
            body, "value", max_length=payload.MAX_TAG_VAL_LENGTH, required=False, any_text=True
        ),
    )
    return {}


@endpoint("DELETE")
def model_versions_delete_tag(request, user, body):
    registry.set_version_tag(
        user=user, name=_name(body), version=body.get("version"), key=_name(body, "key"), value=None
    )
    return {}


@endpoint("GET")
def model_versions_download_uri(request, user, body):
    mv = registry.get_version(_name(body), body.get("version"))
    return {"artifact_uri": registry.download_uri(mv)}
