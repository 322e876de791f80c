"""The old ``/dashboard/<path>`` addresses: a permanent redirect to ``/<path>``.

The pages once lived under ``/dashboard/`` beside the forms at the root; now
every page and action has one address (dashboard/web/urls.py). Bookmarks and links
in notes keep working: a GET gets 301, any other method 308 (the browser
repeats the POST at the new address instead of turning it into a GET).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponsePermanentRedirect


class PermanentRedirectKeepMethod(HttpResponsePermanentRedirect):
    status_code = 308


def moved(request: HttpRequest, rest: str) -> HttpResponsePermanentRedirect:
    # "/dashboard//host" must not become the protocol-relative "//host"
    path = "/" + rest.lstrip("/")
    query = request.META.get("QUERY_STRING", "")
    target = f"{path}?{query}" if query else path
    if request.method in ("GET", "HEAD"):
        return HttpResponsePermanentRedirect(target)
    return PermanentRedirectKeepMethod(target)
