"""The MLflow tracking REST API (``/api/2.0/mlflow/...``, and the same under
``/ajax-api/2.0/mlflow/``), the part MLflow clients use to log runs: the
request and response shapes of MLflow's ``service.proto`` as JSON. Views
read and check the request (tracking/payload.py) and call the services;
every refusal is MLflow's error JSON (tracking/errors.py), never a 500
(an unexpected exception is logged and answered INTERNAL_ERROR; a database
busy with another writer is TEMPORARILY_UNAVAILABLE, which clients retry).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from lab.api.middleware import RETRY_AFTER_S
from lab.experiments.models import Experiment
from lab.runs.models import Run, RunOrigin
from lab.tracking import payload, services
from lab.tracking.auth import request_user
from lab.tracking.errors import (
    ENDPOINT_NOT_FOUND,
    INTERNAL_ERROR,
    TEMPORARILY_UNAVAILABLE,
    MlflowError,
    invalid,
)
from lab.tracking.models import TrackedRun

log = logging.getLogger("lab.tracking")

MAX_RUNS_PER_PAGE = 50000  # MLflow's SEARCH_MAX_RESULTS_THRESHOLD
DEFAULT_RUNS_PER_PAGE = 1000
MAX_EXPERIMENTS_PER_PAGE = 50000
Handler = Callable[[HttpRequest, Any, dict[str, Any]], dict[str, Any]]


def endpoint(*methods: str) -> Callable[[Handler], Callable[[HttpRequest], JsonResponse]]:
    """A view answering ``methods`` with the handler's dict as JSON, after the caller's
    credentials (tracking/auth.py) are checked and the body is read."""

    def wrap(handler: Handler) -> Callable[[HttpRequest], JsonResponse]:
        @csrf_exempt
        def view(request: HttpRequest) -> JsonResponse:
            try:
                if request.method not in methods:
                    raise MlflowError(
                        ENDPOINT_NOT_FOUND,
                        f"{request.method} {request.path} is not an endpoint "
                        f"(use {' or '.join(methods)})",
                    )
                user = request_user(request)
                body = payload.parse_body(request)
                return JsonResponse(handler(request, user, body))
            except MlflowError as exc:
                return exc.response()
            except (OperationalError, InterfaceError) as exc:
                log.warning("tracking %s: database busy: %s", request.path, exc)
                response = MlflowError(
                    TEMPORARILY_UNAVAILABLE, "the database is busy or unreachable; retry"
                ).response()
                response["Retry-After"] = str(RETRY_AFTER_S)
                return response
            except Exception:
                log.exception("tracking %s failed", request.path)
                return MlflowError(
                    INTERNAL_ERROR, "internal error (logged on the server)"
                ).response()

        view.__name__ = handler.__name__
        return view

    return wrap


@csrf_exempt
def not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    return MlflowError(
        ENDPOINT_NOT_FOUND, f"{request.method} {request.path}: this server has no such endpoint"
    ).response()


# --------------------------------------------------------------------------- JSON shapes


def _ms(dt) -> int | None:
    return int(dt.timestamp() * 1000) if dt is not None else None


def experiment_json(experiment: Experiment) -> dict[str, Any]:
    return {
        "experiment_id": str(experiment.pk),
        "name": experiment.name,
        "artifact_location": "",
        "lifecycle_stage": "active",
        "creation_time": _ms(experiment.created_at),
        "last_update_time": _ms(experiment.updated_at),
        "tags": [],
    }


def _kv(mapping: dict[str, Any]) -> list[dict[str, str]]:
    return [{"key": k, "value": str(v)} for k, v in sorted(mapping.items())]


def run_json(run: Run, tracked: TrackedRun) -> dict[str, Any]:
    info = {
        "run_id": str(run.pk),
        "run_uuid": str(run.pk),
        "run_name": run.variant,
        "experiment_id": str(run.experiment_id),
        "user_id": run.owner.get_username(),
        "status": services.LAB_TO_MLFLOW_STATUS[run.status],
        "start_time": tracked.start_time,
        "artifact_uri": "",
        "lifecycle_stage": "active",
    }
    if tracked.end_time is not None:
        info["end_time"] = tracked.end_time
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
        "info": info,
        "data": {
            "metrics": metrics,
            "params": _kv((run.config or {}).get("params") or {}),
            "tags": _kv(tracked.tags),
        },
        "inputs": {},
    }


def _run_id(body: dict[str, Any]) -> str:
    run_id = body.get("run_id") or body.get("run_uuid")
    if run_id in (None, ""):
        raise invalid("Missing value for required parameter 'run_id'.")
    return str(run_id)


def _page(body: dict[str, Any], default: int, most: int) -> tuple[int, int]:
    limit = payload.integer(body, "max_results", default=default, lo=1, hi=most) or default
    token = body.get("page_token") or "0"
    if not (isinstance(token, str) and token.isascii() and token.isdigit() and len(token) < 12):
        raise invalid(f"Invalid page token {token!r}")
    return int(token), limit


def _next_token(offset: int, limit: int, total: int) -> dict[str, str]:
    return {"next_page_token": str(offset + limit)} if offset + limit < total else {}


# Search filters: equality clauses joined by AND, the part of MLflow's filter grammar
# clients build to find a run or an experiment by name, status, tag or param.
_CLAUSE = re.compile(
    r"""\s*(?P<kind>attributes?|attr|run|tags?|params?|metrics?)?\.?
        (?P<key>`[^`]+`|"[^"]+"|[\w.\-/:]+)\s*
        (?P<op>=|!=)\s*
        (?P<value>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\s*$""",
    re.VERBOSE,
)


def _clauses(text: str) -> list[tuple[str, str, str, str]]:
    if not text or not text.strip():
        return []
    out = []
    for part in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE):
        match = _CLAUSE.match(part)
        if match is None:
            raise invalid(
                f"Unsupported filter clause {part!r}: this server takes equality clauses "
                "(attributes.status = 'RUNNING', tags.k = 'v', params.k = 'v', "
                "attributes.run_name = 'v') joined by AND"
            )
        kind = (match["kind"] or "attributes").rstrip("s")
        kind = {"attr": "attribute", "run": "attribute"}.get(kind, kind)
        key = match["key"].strip('`"')
        out.append((kind, key, match["op"], match["value"][1:-1]))
    return out


def _run_matches(run: Run, tracked: TrackedRun, clauses) -> bool:
    for kind, key, op, value in clauses:
        if kind == "attribute":
            actual = {
                "status": services.LAB_TO_MLFLOW_STATUS[run.status],
                "run_name": run.variant,
                "run_id": str(run.pk),
                "user_id": run.owner.get_username(),
            }.get(key)
        elif kind == "tag":
            actual = tracked.tags.get(key)
        elif kind == "param":
            actual = ((run.config or {}).get("params") or {}).get(key)
        else:
            raise invalid("metric filters are not supported by this server")
        if (actual == value) != (op == "="):
            return False
    return True


# --------------------------------------------------------------------------- experiments


@endpoint("POST")
def experiments_create(request, user, body):
    name = payload.text(body, "name", max_length=payload.MAX_EXPERIMENT_NAME_LENGTH).strip()
    if len(name) > 200:  # the lab's Experiment.name
        raise invalid(f"Invalid experiment name: at most 200 characters ({len(name)} given)")
    experiment = services.create_experiment(user=user, name=name)
    return {"experiment_id": str(experiment.pk)}


@endpoint("GET")
def experiments_get(request, user, body):
    experiment = services.get_experiment(body.get("experiment_id"), user)
    return {"experiment": experiment_json(experiment)}


@endpoint("GET")
def experiments_get_by_name(request, user, body):
    name = payload.text(body, "experiment_name", max_length=payload.MAX_EXPERIMENT_NAME_LENGTH)
    return {"experiment": experiment_json(services.get_experiment_by_name(name, user))}


@endpoint("GET", "POST")
def experiments_search(request, user, body):
    offset, limit = _page(body, MAX_EXPERIMENTS_PER_PAGE, MAX_EXPERIMENTS_PER_PAGE)
    experiments = Experiment.objects.order_by("-created_at", "-pk")
    for kind, key, op, value in _clauses(str(body.get("filter") or "")):
        if kind != "attribute" or key != "name":
            raise invalid("experiment filters take only name = '...' or name != '...'")
        experiments = (
            experiments.filter(name=value) if op == "=" else experiments.exclude(name=value)
        )
    total = experiments.count()
    page = experiments[offset : offset + limit]
    return {
        "experiments": [experiment_json(e) for e in page],
        **_next_token(offset, limit, total),
    }


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
    return {"run": run_json(run, tracked)}


@endpoint("GET")
def runs_get(request, user, body):
    run, tracked = services.get_run(_run_id(body))
    return {"run": run_json(run, tracked)}


@endpoint("POST")
def runs_update(request, user, body):
    run, tracked = services.update_run(
        user=user,
        run_id=_run_id(body),
        status=payload.text(body, "status", max_length=20, required=False),
        end_time=payload.integer(body, "end_time", lo=0, hi=payload.MAX_TIMESTAMP_MS),
        run_name=payload.text(
            body, "run_name", max_length=payload.MAX_RUN_NAME_LENGTH, required=False
        ),
    )
    return {"run_info": run_json(run, tracked)["info"]}


@endpoint("POST")
def runs_delete(request, user, body):
    services.delete_run(user=user, run_id=_run_id(body))
    return {}


@endpoint("GET", "POST")
def runs_search(request, user, body):
    ids = body.get("experiment_ids") or []
    if isinstance(ids, str):
        ids = [ids]
    if not isinstance(ids, list) or len(ids) > 1000:
        raise invalid("Invalid value for parameter 'experiment_ids': a list of ids")
    experiment_pks = [services.get_experiment(i, user).pk for i in ids]
    offset, limit = _page(body, DEFAULT_RUNS_PER_PAGE, MAX_RUNS_PER_PAGE)
    clauses = _clauses(str(body.get("filter") or ""))
    runs = (
        Run.objects.filter(origin=RunOrigin.EXTERNAL, experiment_id__in=experiment_pks)
        .select_related("owner")
        .order_by("-created_at", "-pk")
    )
    tracked = {t.run_id: t for t in TrackedRun.objects.filter(run__in=runs)}
    matching = [
        (r, tracked[r.pk])
        for r in runs
        if r.pk in tracked and _run_matches(r, tracked[r.pk], clauses)
    ]
    page = matching[offset : offset + limit]
    return {
        "runs": [run_json(r, t) for r, t in page],
        **_next_token(offset, limit, len(matching)),
    }


def _points(entries: Any) -> list[payload.Point]:
    if isinstance(entries, list) and len(entries) > payload.MAX_METRICS_PER_BATCH:
        raise invalid(
            f"A batch logging request can contain at most {payload.MAX_METRICS_PER_BATCH} "
            f"metrics. Got {len(entries)} metrics."
        )
    return payload.points(entries)


MAX_HISTORY_PER_PAGE = 25000  # MLflow's GET_METRIC_HISTORY_MAX_RESULTS


@endpoint("GET")
def metrics_get_history(request, user, body):
    key = payload.text(body, "metric_key", max_length=payload.MAX_ENTITY_KEY_LENGTH)
    offset, limit = _page(body, MAX_HISTORY_PER_PAGE, MAX_HISTORY_PER_PAGE)
    points = services.metric_history(_run_id(body), key)
    return {"metrics": points[offset : offset + limit], **_next_token(offset, limit, len(points))}


@endpoint("POST")
def runs_log_batch(request, user, body):
    metrics = _points(body.get("metrics"))
    params = payload.pairs(
        body.get("params"), "params", max_value_length=payload.MAX_PARAM_VAL_LENGTH
    )
    tags = payload.pairs(body.get("tags"), "tags", max_value_length=payload.MAX_TAG_VAL_LENGTH)
    if len(params) > payload.MAX_PARAMS_TAGS_PER_BATCH:
        raise invalid(
            f"A batch logging request can contain at most {payload.MAX_PARAMS_TAGS_PER_BATCH} "
            f"params. Got {len(params)} params."
        )
    if len(tags) > payload.MAX_PARAMS_TAGS_PER_BATCH:
        raise invalid(
            f"A batch logging request can contain at most {payload.MAX_PARAMS_TAGS_PER_BATCH} "
            f"tags. Got {len(tags)} tags."
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
    services.log_batch(user=user, run_id=_run_id(body), metrics=metrics, params=params, tags=tags)
    return {}


@endpoint("POST")
def runs_log_metric(request, user, body):
    point = payload.point(body, "metric")
    services.log_batch(user=user, run_id=_run_id(body), metrics=[point])
    return {}


@endpoint("POST")
def runs_log_parameter(request, user, body):
    (param,) = payload.pairs(
        [{"key": body.get("key"), "value": body.get("value")}],
        "param",
        max_value_length=payload.MAX_PARAM_VAL_LENGTH,
    )
    services.log_batch(user=user, run_id=_run_id(body), params=[param])
    return {}


@endpoint("POST")
def runs_set_tag(request, user, body):
    (tag,) = payload.pairs(
        [{"key": body.get("key"), "value": body.get("value")}],
        "tag",
        max_value_length=payload.MAX_TAG_VAL_LENGTH,
    )
    services.set_tag(user=user, run_id=_run_id(body), key=tag[0], value=tag[1])
    return {}


@endpoint("POST")
def runs_delete_tag(request, user, body):
    key = payload.entity_key(body.get("key"), "key")
    services.delete_tag(user=user, run_id=_run_id(body), key=key)
    return {}


# --------------------------------------------------------------------------- TensorBoard


@endpoint("POST")
def tensorboard_import(request, user, body):
    """``{"experiment_id", "path", "run_name", "framework", "run_id", "final"}``: read the
    event files in ``path`` (inside LAB_ASSET_ROOTS) into a new external run, or into
    ``run_id`` again (a folder still being written: only what is new is added).
    ``final`` (default true) marks the run finished; false leaves it running for the
    next call."""
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
    final = body.get("final", True)
    if not isinstance(final, bool):
        raise invalid("Invalid value for parameter 'final': true or false")
    if body.get("run_id") not in (None, ""):
        job = TensorBoardImport.resume(services.get_run(_run_id(body))[0].pk, folder)
    else:
        job = TensorBoardImport.start(
            user=user,
            experiment_id=body.get("experiment_id"),
            folder=folder,
            run_name=payload.text(
                body, "run_name", max_length=payload.MAX_RUN_NAME_LENGTH, required=False
            ),
            framework=framework,
        )
    points = job.poll(user)
    run = job.finish(user) if final else job.run
    return {"run_id": str(run.pk), "points": points, "status": run.status}
