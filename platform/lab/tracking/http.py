"""The MLflow endpoints' shared plumbing: the view decorator (credentials, body,
MLflow's error JSON, never a 500), ids and pages read from a request."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from lab.api.middleware import RETRY_AFTER_S
from lab.tracking import payload
from lab.tracking.auth import request_user
from lab.tracking.errors import (
    ENDPOINT_NOT_FOUND,
    INTERNAL_ERROR,
    TEMPORARILY_UNAVAILABLE,
    MlflowError,
    invalid,
)

log = logging.getLogger("lab.tracking")

Handler = Callable[..., Any]


def endpoint(
    *methods: str, raw_body: bool = False
) -> Callable[[Handler], Callable[..., HttpResponse]]:
    """A view answering ``methods`` with the handler's dict as JSON (or the
    ``HttpResponse`` it returns), after the caller's credentials (tracking/auth.py)
    are checked and the body is read (``raw_body``: left unread, for uploads).
    The handler is called as ``handler(request, user, body, **url_kwargs)``."""

    def wrap(handler: Handler) -> Callable[..., HttpResponse]:
        @csrf_exempt
        def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            try:
                if request.method not in methods:
                    raise MlflowError(
                        ENDPOINT_NOT_FOUND,
                        f"{request.method} {request.path} is not an endpoint "
                        f"(use {' or '.join(methods)})",
                    )
                user = request_user(request)
                body = {} if raw_body else payload.parse_body(request)
                answer = handler(request, user, body, **kwargs)
                return answer if isinstance(answer, HttpResponseBase) else JsonResponse(answer)
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
        view.__doc__ = handler.__doc__
        return view

    return wrap


@csrf_exempt
def not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    return MlflowError(
        ENDPOINT_NOT_FOUND, f"{request.method} {request.path}: this server has no such endpoint"
    ).response()


def run_id_of(body: dict[str, Any]) -> str:
    run_id = body.get("run_id") or body.get("run_uuid")
    if run_id in (None, ""):
        raise invalid("Missing value for required parameter 'run_id'.")
    return str(run_id)


def page(body: dict[str, Any], default: int, most: int) -> tuple[int, int]:
    """(offset, limit) of a paged request: ``max_results`` and ``page_token`` (an
    offset, as a decimal string)."""
    limit = payload.integer(body, "max_results", default=default, lo=1, hi=most) or default
    token = body.get("page_token") or "0"
    if not (isinstance(token, str) and token.isascii() and token.isdigit() and len(token) < 12):
        raise invalid(f"Invalid page token {token!r}")
    return int(token), limit


def next_token(offset: int, limit: int, total: int) -> dict[str, str]:
    return {"next_page_token": str(offset + limit)} if offset + limit < total else {}


def string_list(body: dict[str, Any], field: str, *, most: int = 1000) -> list[str]:
    """A list of strings (a GET repeats the key; a single value is a list of one)."""
    value = body.get(field)
    if value in (None, ""):
        return []
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, list)
        or len(value) > most
        or not all(isinstance(v, str) for v in value)
    ):
        raise invalid(f"Invalid value for parameter '{field}': a list of at most {most} strings")
    return value
