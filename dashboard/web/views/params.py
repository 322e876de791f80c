"""The query of every dashboard page and chart endpoint, as one model each.

Parsed with the platform's one query parser (``lab.inputs.query.parse_query``): bad
input raises ``trainer.errors.FieldError`` naming the parameter; the chart
endpoints answer it with 400 JSON, the pages with a 400 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from django.http import HttpRequest
from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from dashboard.charts.build import DEFAULT_MAX_POINTS, Window
from dashboard.charts.export import EXPORT_FORMATS
from dashboard.charts.panels import METRIC_KEY_RE
from dashboard.charts.time_axis import X_MODES
from dashboard.review.queries import SORTS
from lab.inputs.query import (
    OptionalWholeNumber,
    Q,
    Query,
    ascii_id,
    comma_separated,
    one_of,
    parse_query,
)
from lab.runs.models import RunStatus
from trainer.errors import FieldError

MAX_RUNS_PER_REQUEST = 200
MAX_KEYS = 64


def parse(model: type[Q], request: HttpRequest) -> Q:
    """``request.GET`` as ``model`` (raises ``FieldError``)."""
    return parse_query(model, request.GET)


# --------------------------------------------------------------------------- field types
def _run_ids(value: Any, info: ValidationInfo) -> list[int]:
    """Run ids from ``?runs=1,2&runs=3`` in the order given, without repeats."""
    name = info.field_name
    parts = value if isinstance(value, list) else [value]
    ids: list[int] = []
    for part in parts:
        run_id = ascii_id(part)  # ASCII digits inside a 64-bit integer ("²", 10**30: no)
        if run_id is None:
            raise ValueError(f"{name} must be run ids separated by commas")
        ids.append(run_id)
    ids = list(dict.fromkeys(ids))
    if len(ids) > MAX_RUNS_PER_REQUEST:
        raise ValueError(f"at most {MAX_RUNS_PER_REQUEST} runs at once")
    return ids


# Before-validators run last to first: split on commas, then check the ids.
RunIds = Annotated[list[int], BeforeValidator(_run_ids), BeforeValidator(comma_separated)]


def _metric_key(value: Any) -> str:
    if not isinstance(value, str) or not METRIC_KEY_RE.match(value):
        raise ValueError("give a metric key, e.g. key=mismatch/kl_k3")
    return value


MetricKey = Annotated[str, BeforeValidator(_metric_key)]


def _metric_keys(value: Any) -> list[str]:
    keys = list(dict.fromkeys(comma_separated(value)))
    if not keys or len(keys) > MAX_KEYS or not all(METRIC_KEY_RE.match(k) for k in keys):
        raise ValueError(f"give 1 to {MAX_KEYS} metric keys, e.g. keys=a/b,c/d")
    return keys


def _export_format(value: Any) -> str | None:
    fmt = str(value or "").strip().lower() or None
    if fmt is not None and fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of: {', '.join(sorted(EXPORT_FORMATS))}")
    return fmt


ExportFormat = Annotated[str | None, BeforeValidator(_export_format)]


# --------------------------------------------------------------------------- chart endpoints
class ChartQuery(Query):
    """``?max_points=&start=&end=&format=`` of every chart endpoint. A download
    (``format``) without max_points is full resolution."""

    max_points: OptionalWholeNumber = None
    start: OptionalWholeNumber = None
    end: OptionalWholeNumber = None
    format: ExportFormat = None

    @model_validator(mode="after")
    def _window_is_valid(self) -> ChartQuery:
        self.window  # noqa: B018 - raises FieldError naming the field
        return self

    @property
    def window(self) -> Window:
        max_points = self.max_points
        if max_points is None and self.format is None:
            max_points = DEFAULT_MAX_POINTS
        try:
            return Window(max_points, self.start, self.end)
        except ValueError as exc:
            field = "max_points" if "max_points" in str(exc) else "start"
            raise FieldError([(field, str(exc))]) from None


# The x axis of a line chart (dashboard/charts/time_axis.py): steps, wall-clock time or
# time since each run started.
XAxis = one_of(*X_MODES)


class RunChartQuery(ChartQuery):
    """One metric of a run; ``baseline`` 0 hides the pinned baseline."""

    key: MetricKey = Field("", validate_default=True)  # missing: the same message as bad
    baseline: OptionalWholeNumber = None
    x: XAxis = "step"


class HeatmapQuery(ChartQuery):
    layer: OptionalWholeNumber = 0
    scale: one_of("auto", "shared") = "auto"  # shared: the compare page's color range

    @field_validator("layer")
    @classmethod
    def _layer_not_negative(cls, value: int | None) -> int:
        if value is not None and value < 0:
            raise ValueError("layer must be a non-negative integer")
        return value or 0


class CompareChartQuery(ChartQuery):
    runs: RunIds = []
    key: MetricKey = Field("", validate_default=True)
    baseline: OptionalWholeNumber = None
    x: XAxis = "step"


class CompareChartsQuery(ChartQuery):
    """A chart group: several metrics, drawn whole (no zoom window)."""

    runs: RunIds = []
    keys: Annotated[list[str], BeforeValidator(_metric_keys)] = Field("", validate_default=True)
    baseline: OptionalWholeNumber = None
    x: XAxis = "step"

    @model_validator(mode="after")
    def _drawn_whole(self) -> CompareChartsQuery:
        if self.start is not None or self.end is not None:
            raise FieldError(
                [("start", "a chart group is drawn whole; zoom through compare/chart")]
            )
        return self


class VariantChartQuery(ChartQuery):
    key: MetricKey = Field("", validate_default=True)
    band: one_of("minmax", "std") = "minmax"  # around the mean over seeds


def _trimmed(limit: int) -> Any:
    return BeforeValidator(lambda value: str(value).strip()[:limit])


class RunSelectionQuery(Query):
    """The runs of a stability review: ``?runs=`` (repeated or comma separated),
    else all of ``?experiment=`` or ``?sweep=``."""

    runs: RunIds = []
    experiment: OptionalWholeNumber = None
    sweep: OptionalWholeNumber = None
    format: ExportFormat = None
    # Count cancelled and failed runs as seeds (dashboard/review/seeds.py); off by default.
    stopped: bool = False
    # The log-rank baseline variant (dashboard/charts/stability_stats.py reference_of).
    reference: Annotated[str, _trimmed(200)] = ""
    # Which table a download holds: the seeds' table or the time-to-collapse table.
    table: Literal["stability", "survival"] = "stability"

    def scope(self) -> dict[str, str | int]:
        """The selection as query parameters for the review's charts and downloads:
        every chosen run, however the ids were given, and the seed switch."""
        extra: dict[str, str | int] = {"stopped": 1} if self.stopped else {}
        if self.reference:
            extra["reference"] = self.reference
        if self.runs:
            return {"runs": ",".join(map(str, self.runs)), **extra}
        if self.experiment is not None:
            return {"experiment": self.experiment, **extra}
        if self.sweep is not None:
            return {"sweep": self.sweep, **extra}
        return {}


# --------------------------------------------------------------------------- pages
class RunsListQuery(Query):
    """The runs list's filters. Unknown statuses and sorts show everything, newest first."""

    experiment: OptionalWholeNumber = None
    status: str = ""
    tag: Annotated[str, _trimmed(50)] = ""
    owner: Annotated[str, _trimmed(150)] = ""
    queue: Annotated[str, _trimmed(64)] = ""
    sort: str = "newest"
    page: str | None = None

    @field_validator("status")
    @classmethod
    def _known_status(cls, value: str) -> str:
        return value if value in RunStatus.values else ""

    @field_validator("sort")
    @classmethod
    def _known_sort(cls, value: str) -> str:
        return value if value in SORTS else "newest"


class RunPageQuery(Query):
    baseline: OptionalWholeNumber = None
    x: XAxis = "step"


def _columns(limit: int) -> Any:
    def check(value: Any) -> list[str]:
        names = list(dict.fromkeys(comma_separated(value)))
        if len(names) > limit or any(len(n) > 250 for n in names):
            raise ValueError(f"at most {limit} columns of up to 250 characters")
        return names

    return Annotated[list[str], BeforeValidator(check)]


class RunsTableQuery(Query):
    """An experiment's runs table and its parallel coordinates: the hyperparameter and
    metric columns (``params=a,b&metrics=x,y``; none given: the defaults), an MLflow
    search filter, the sort column (``param:<key>``, ``metric:<key>`` or a fixed one)
    and order, the metric the parallel lines are coloured by, a CSV download."""

    params: _columns(12) = []
    metrics: _columns(12) = []
    filter: Annotated[str, _trimmed(2000)] = ""
    sort: Annotated[str, _trimmed(260)] = "run"
    order: one_of("asc", "desc") = "asc"
    color: Annotated[str, _trimmed(250)] = ""
    format: one_of("", "csv") = ""

    @field_validator("metrics")
    @classmethod
    def _metric_names(cls, value: list[str]) -> list[str]:
        if not all(METRIC_KEY_RE.match(k) for k in value):
            raise ValueError("metrics must be metric keys, e.g. metrics=reward/mean")
        return value


class VariantPageQuery(Query):
    band: one_of("minmax", "std") = "minmax"


class ComparePageQuery(Query):
    runs: RunIds = []
    baseline: OptionalWholeNumber = None
    layer: OptionalWholeNumber = None
    x: XAxis = "step"

    @field_validator("layer")
    @classmethod
    def _layer_not_negative(cls, value: int | None) -> int | None:
        if value is not None and value < 0:
            raise ValueError("layer must be a non-negative integer")
        return value
