"""JSON errors with field paths: ``{"detail": ..., "errors": {"config.run.steps": [...]}}``.

Every 4xx of the API has this shape; config errors keep the schema's dotted
paths so a client (or the form) can point at the offending field.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from lab.api.middleware import database_unreachable, unavailable_response
from lab.experiments.rights import NotAllowed
from lab.runs.lifecycle import IdempotencyConflict, InvalidState
from trainer.errors import FieldError

logger = logging.getLogger("lab.api")


def flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail -> {"a.b.0": ["message"]}."""
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key == "non_field_errors":
                path = prefix or "__all__"
            for k, v in flatten(value, path).items():
                out.setdefault(k, []).extend(v)
    elif isinstance(detail, list):
        if all(not isinstance(d, dict | list) for d in detail):
            out[prefix or "__all__"] = [str(d) for d in detail]
        else:
            for i, item in enumerate(detail):
                for k, v in flatten(item, f"{prefix}.{i}" if prefix else str(i)).items():
                    out.setdefault(k, []).extend(v)
    else:
        out[prefix or "__all__"] = [str(detail)]
    return out


def error_response(errors: dict[str, list[str]], code: int, detail: str) -> Response:
    return Response({"detail": detail, "errors": errors}, status=code)


def json_exception_handler(exc, context):
    if isinstance(exc, FieldError):
        return error_response(exc.as_dict(), status.HTTP_400_BAD_REQUEST, "invalid input")
    if isinstance(exc, NotAllowed):
        return error_response({"__all__": [str(exc)]}, status.HTTP_403_FORBIDDEN, str(exc))
    if isinstance(exc, InvalidState):
        return error_response({"__all__": [str(exc)]}, status.HTTP_409_CONFLICT, str(exc))
    if isinstance(exc, IdempotencyConflict):
        return error_response(
            {"Idempotency-Key": [str(exc)]}, status.HTTP_422_UNPROCESSABLE_ENTITY, str(exc)
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if database_unreachable(exc):  # a restart or failover: clients retry, no traceback
        request = context.get("request")
        logger.warning("database unreachable: %s", exc)
        return unavailable_response(request.path if request is not None else "/api/")
    response = exception_handler(exc, context)
    if response is None:
        # Not an API error: Django answers 500. Logged here with the view and the
        # traceback so every 500 of the API is on stderr, whatever the handler's
        # caller does next.
        view = context.get("view")
        logger.error("unexpected %s in %s", type(exc).__name__, type(view).__name__, exc_info=exc)
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = {"detail": "invalid input", "errors": flatten(exc.detail)}
    else:
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else ""
        response.data = {"detail": str(detail), "errors": {"__all__": [str(detail)]}}
    return response
