"""Refuse oversized request bodies and query strings no view can use before anything parses them."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponseBadRequest, JsonResponse

from lab.text import forbidden_character

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
