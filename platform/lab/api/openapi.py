"""``/api/openapi``: the API's OpenAPI document.

Clients get YAML (``application/vnd.oai.openapi``) or JSON (``?format=json``)
as drf-spectacular renders them. A browser asks for HTML first; given that
media type it would download a file, so it gets the same YAML as
``text/plain``, which it shows (the Swagger UI is at ``/api/docs/``).
"""

from __future__ import annotations

from drf_spectacular.views import SpectacularAPIView


class OpenApiView(SpectacularAPIView):
    # The schema document is not an endpoint of the schema (as drf-spectacular's own view).
    schema = None

    def get(self, request, *args, **kwargs):
        response = super().get(request, *args, **kwargs)
        accept = request.META.get("HTTP_ACCEPT", "")
        if "text/html" in accept and "format" not in request.GET:
            response.content_type = "text/plain; charset=utf-8"
        return response
