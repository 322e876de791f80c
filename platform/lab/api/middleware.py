"""Refuse oversized request bodies and query strings no view can use before anything
parses them; answer 503 with Retry-After while the database is unreachable."""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import HttpResponse, HttpResponseBadRequest, JsonResponse

from lab.text import forbidden_character

log = logging.getLogger("lab.api")
# Artifact uploads stream to the artifact store under their own bound
# (LAB_MAX_ARTIFACT_BYTES, lab/tracking/artifact_store.py).
ARTIFACT_UPLOAD_PREFIXES = (
    "/api/2.0/mlflow-artifacts/artifacts/",
    "/ajax-api/2.0/mlflow-artifacts/artifacts/",
)


class PayloadLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        limit = settings.LAB_MAX_PAYLOAD_BYTES
        if request.method == "PUT" and request.path.startswith(ARTIFACT_UPLOAD_PREFIXES):
            return self.get_response(request)
        if length > limit:
            return JsonResponse(
                {
                    "detail": f"request body of {length} bytes exceeds the limit of {limit} bytes",
                    "errors": {"__all__": [f"payload too large (limit {limit} bytes)"]},
                },
                status=413,
            )
        return self.get_response(request)


class QueryTextMiddleware:
    """Refuse a query string holding a control character or a lone surrogate.

    Every filter (``?owner=``, ``?queue=``, ``?tag=``) ends in a database query,
    and PostgreSQL cannot compare text holding NUL: one check here, before any
    view, answers 400 naming the parameter instead of a 500. The API answers
    JSON in its error shape; pages answer plain text.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        for key, values in request.GET.lists():
            for text in (key, *values):
                bad = forbidden_character(text)
                if bad:
                    name = key if forbidden_character(key) is None else "__all__"
                    message = f"the query parameter {key!r} cannot contain {bad}"
                    return _bad_request(request, name, message)
        return self.get_response(request)


def _bad_request(request, field: str, message: str):
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "invalid input", "errors": {field: [message]}}, status=400)
    return HttpResponseBadRequest(f"Bad request: {message}", content_type="text/plain")


# Seconds a client is told to wait before it retries while the database is away.
RETRY_AFTER_S = 5
_MLFLOW_PREFIXES = ("/api/2.0/mlflow/", "/ajax-api/2.0/mlflow/")


def database_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached now (a server restarting,
    a failover, a network cut, SQLite's file locked or unopenable), as opposed to a
    query the database refused. PostgreSQL reports bad SQL as ProgrammingError or
    DataError, so an OperationalError or InterfaceError there is the connection's;
    SQLite reports both as OperationalError, told apart by its message."""
    from django.db import InterfaceError, OperationalError, connection

    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    if connection.vendor != "sqlite":
        return True
    message = str(exc).lower()
    return any(
        words in message
        for words in ("database is locked", "unable to open database", "disk i/o error")
    )


def unavailable_response(path: str) -> HttpResponse:
    """503 with Retry-After in the shape the caller at ``path`` reads: MLflow's
    ``TEMPORARILY_UNAVAILABLE`` (its clients retry it), the API's error JSON, or text."""
    message = "the database is unreachable (restarting?); retry shortly"
    response: HttpResponse
    if path.startswith(_MLFLOW_PREFIXES):
        response = JsonResponse(
            {"error_code": "TEMPORARILY_UNAVAILABLE", "message": message}, status=503
        )
    elif path.startswith("/api/"):
        response = JsonResponse({"detail": message, "errors": {"__all__": [message]}}, status=503)
    else:
        response = HttpResponse(
            f"Service unavailable: {message}.", status=503, content_type="text/plain"
        )
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


class DatabaseUnavailableMiddleware:
    """Answer 503 with ``Retry-After`` when a view cannot reach the database, instead
    of a 500: API and MLflow clients retry, a browser is told to try again. Anything
    else is left to the usual handling."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exc):
        if not database_unreachable(exc):
            return None
        log.warning("database unreachable on %s: %s", request.path, exc)
        return unavailable_response(request.path)
