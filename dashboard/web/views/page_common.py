"""What every dashboard page shares: the login-and-400 decorator, URLs with a
query string, a live chart's entry and the live-update interval.

Each page renders completely on the server (tables, config, comments,
verdicts); the charts fill themselves from the JSON endpoints (endpoints.py)
through static/dashboard/live.js. Query counts do not grow with the number of
runs shown (tests/dashboard/test_dashboard_queries.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import wraps
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.urls import reverse
from django.utils.html import escape

from dashboard.charts.time_axis import X_MODE_TITLES, X_MODES
from trainer.errors import FieldError

LIVE_INTERVAL_MS = 5000


def page_params(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Login required, and a malformed query parameter answers 400 naming it."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except FieldError as exc:
            return HttpResponseBadRequest(escape(str(exc)))

    return wrapper


def page_url(name: str, args: Sequence = (), **query) -> str:
    """The dashboard URL ``name`` with ``args``, and ``query`` minus empty values."""
    base = reverse(f"dashboard:{name}", args=list(args))
    query = {k: v for k, v in query.items() if v is not None and v != ""}
    return f"{base}?{urlencode(query)}" if query else base


def x_axis_links(current: str, url_of: Callable[[str | None], str]) -> list[dict]:
    """The x-axis choices of a page's line charts (dashboard/charts/time_axis.py): each
    mode's title, the page's URL with it (``url_of(None)`` for steps, the default)
    and whether it is the one shown."""
    return [
        {
            "mode": mode,
            "title": X_MODE_TITLES[mode],
            "url": url_of(None if mode == "step" else mode),
            "current": mode == current,
        }
        for mode in X_MODES
    ]


def chart_entry(chart_id_: str, url: str, title: str = "") -> dict[str, str]:
    """One live chart of a page: its element id, data URL and title."""
    return {"chart_id": chart_id_, "url": url, "title": title}
