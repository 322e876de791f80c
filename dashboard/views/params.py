"""Parsing of the query parameters the pages and chart endpoints share."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from dashboard.charts import DEFAULT_MAX_POINTS, Window
from dashboard.export import EXPORT_FORMATS
from dashboard.panels import METRIC_KEY_RE

MAX_RUNS_PER_REQUEST = 200


class BadParameter(ValueError):
    """A query parameter is malformed; ``field`` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message

    def response(self) -> JsonResponse:
        return JsonResponse({"errors": {self.field: [self.message]}}, status=400)


def _int(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name, "").strip()
    if raw == "":
        return None
    try:
        return int(float(raw))  # live.js sends whole steps; tolerate "120.0"
    except ValueError:
        raise BadParameter(name, f"{name} must be an integer") from None


def run_ids(request: HttpRequest, name: str = "runs") -> list[int]:
    """Run ids from ``?runs=1,2&runs=3`` in the order given, without repeats."""
    ids: list[int] = []
    for chunk in request.GET.getlist(name):
        for part in chunk.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit():
                raise BadParameter(name, f"{name} must be run ids separated by commas")
            ids.append(int(part))
    ids = list(dict.fromkeys(ids))
    if len(ids) > MAX_RUNS_PER_REQUEST:
        raise BadParameter(name, f"at most {MAX_RUNS_PER_REQUEST} runs at once")
    return ids


def optional_id(request: HttpRequest, name: str) -> int | None:
    return _int(request, name)


def export_format(request: HttpRequest) -> str | None:
    fmt = request.GET.get("format", "").strip().lower() or None
    if fmt is not None and fmt not in EXPORT_FORMATS:
        raise BadParameter("format", f"format must be one of: {', '.join(sorted(EXPORT_FORMATS))}")
    return fmt


def window(request: HttpRequest, *, export: bool = False) -> Window:
    """``?max_points=&start=&end=``. A download without max_points is full resolution."""
    max_points = _int(request, "max_points")
    if max_points is None and not export:
        max_points = DEFAULT_MAX_POINTS
    try:
        return Window(max_points, _int(request, "start"), _int(request, "end"))
    except ValueError as exc:
        field = "max_points" if "max_points" in str(exc) else "start"
        raise BadParameter(field, str(exc)) from None


def metric_key(request: HttpRequest) -> str:
    key = request.GET.get("key", "")
    if not METRIC_KEY_RE.match(key):
        raise BadParameter("key", "give a metric key, e.g. key=mismatch/kl_k3")
    return key


MAX_KEYS = 64


def metric_keys(request: HttpRequest) -> list[str]:
    """``?keys=a,b,c``: the metrics of a chart group, in order, at least one."""
    keys = list(dict.fromkeys(k for k in request.GET.get("keys", "").split(",") if k))
    if not keys or len(keys) > MAX_KEYS or not all(METRIC_KEY_RE.match(k) for k in keys):
        raise BadParameter("keys", f"give 1 to {MAX_KEYS} metric keys, e.g. keys=a/b,c/d")
    return keys


def choice(request: HttpRequest, name: str, choices: tuple[str, ...]) -> str:
    """``?name=`` as one of ``choices``; the first is the default."""
    value = request.GET.get(name, choices[0])
    if value not in choices:
        raise BadParameter(name, f"{name} must be {' or '.join(choices)}")
    return value


def heatmap_scale(request: HttpRequest) -> str:
    """``auto`` (each heatmap its own color range) or ``shared`` (a fixed range)."""
    return choice(request, "scale", ("auto", "shared"))


def band(request: HttpRequest) -> str:
    """``minmax`` or ``std``: the band drawn around a variant's mean over seeds."""
    return choice(request, "band", ("minmax", "std"))


def layer(request: HttpRequest, default: int = 0) -> int:
    value = _int(request, "layer")
    if value is None:
        return default
    if value < 0:
        raise BadParameter("layer", "layer must be a non-negative integer")
    return value
