"""Refuse oversized request bodies before anything parses them."""

from __future__ import annotations

from django.conf import settings
from django.http import JsonResponse


class PayloadLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        limit = settings.LAB_MAX_PAYLOAD_BYTES
        if length > limit:
            return JsonResponse(
                {
                    "detail": f"request body of {length} bytes exceeds the limit of {limit} bytes",
                    "errors": {"__all__": [f"payload too large (limit {limit} bytes)"]},
                },
                status=413,
            )
        return self.get_response(request)
