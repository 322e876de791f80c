"""REST API (docs/design.md, section 3.7). Views parse and authorise; services write.

Query parameters are parsed by the one query parser (``lab.inputs.query``): one
model per endpoint's query below.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from django.conf import settings
from django.db.models import Count
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from pydantic import BeforeValidator, field_validator
from rest_framework import generics, status
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from lab.api import serializers as s
from lab.api.assets import with_assets
from lab.api.pagination import BoundedLimitOffsetPagination
from lab.configs import resolve_config
from lab.experiments.models import Experiment, Sweep
from lab.experiments.services import create_experiment, set_shared_with
from lab.inputs.query import CommaSeparated, Query, ascii_id, parse_query
from lab.jobs.health import health
from lab.jobs.models import Worker
from lab.jobs.queries import queue_positions
from lab.runs import bulk, comments, exports, lifecycle, sweeps
from lab.runs.dispatch import PublishFailed
from lab.runs.metrics import read as metric_reads
from lab.runs.metrics.read import MIN_POINTS
from lab.runs.models import ACTIVE_STATUSES, Comment, Run, RunStatus
from lab.runs.queue_order import in_queue_order
from trainer.config import json_schema
from trainer.config.presets import list_presets, preset_dict
from trainer.metric_keys import METRIC_NAME

# the metric store's names (trainer/metric_keys.py METRIC_NAME)
METRIC_KEY = re.compile(rf"^{METRIC_NAME.pattern}$")
MAX_METRIC_KEYS = 64
DEFAULT_MAX_POINTS = 1000  # per key, when the client does not say


def _bounded_int(low: int, high: int) -> Any:
    """A whole number from ``low`` to ``high``; '' means not given."""

    def check(value: Any) -> int | None:
        if value is None or value == "":
            return None
        if not re.fullmatch(r"\d{1,10}", str(value)) or not low <= int(value) <= high:
            raise ValueError(f"an integer from {low} to {high}")
        return int(value)

    return BeforeValidator(check)


class MetricsQuery(Query):
    """``?keys=a,b&max_points=&start=&end=``; no keys lists the run's keys."""

    keys: CommaSeparated = []
    max_points: Annotated[int | None, _bounded_int(MIN_POINTS, 100_000)] = DEFAULT_MAX_POINTS
    start: Annotated[int | None, _bounded_int(0, 10**9)] = None
    end: Annotated[int | None, _bounded_int(0, 10**9)] = None

    @field_validator("keys")
    @classmethod
    def _metric_keys(cls, keys: list[str]) -> list[str]:
        if len(keys) > MAX_METRIC_KEYS:
            raise ValueError(f"at most {MAX_METRIC_KEYS} keys per request")
        bad = [k for k in keys if not METRIC_KEY.match(k)]
        if bad:
            raise ValueError(f"not a metric key: {bad[0][:100]!r}")
        return keys


class RunListQuery(Query):
    """Filters of the run list; a malformed one is ignored (the list is unfiltered)."""

    experiment: int | None = None
    status: str | None = None

    @field_validator("experiment", mode="before")
    @classmethod
    def _id_or_nothing(cls, value: Any) -> int | None:
        return ascii_id(value)

    @field_validator("status")
    @classmethod
    def _known_status(cls, value: str | None) -> str | None:
        return value if value in RunStatus.values else None


@extend_schema(responses=dict)
@api_view(["GET"])
@permission_classes([AllowAny])
def health_view(request):
    """For machines (load balancers, compose healthchecks): ``{"status": "ok"}`` or
    503 ``{"status": "unavailable"}``, to anyone. A logged-in user also gets the
    database, broker and live workers; an anonymous caller learns nothing about
    the deployment (hosts, queues, versions, error texts)."""
    report = health()
    body: dict[str, Any] = {"status": "ok" if report["ok"] else "unavailable"}
    if request.user is not None and request.user.is_authenticated:
        body.update(report)
    return Response(body, status=200 if report["ok"] else 503)


@extend_schema(responses=dict)
@api_view(["GET"])
def config_schema_view(request):
    return Response(json_schema())


@extend_schema(responses=dict)
@api_view(["GET"])
def presets_view(request):
    return Response(
        [
            {"name": name, "description": description, "config": preset_dict(name)}
            for name, description in list_presets()
        ]
    )


def _experiments():
    return (
        Experiment.objects.select_related("owner")
        .prefetch_related("shared_with")
        .annotate(run_total=Count("runs"))
    )


class ExperimentList(generics.ListAPIView):
    serializer_class = s.ExperimentSerializer

    def get_queryset(self):
        return _experiments()

    @extend_schema(request=s.ExperimentCreateSerializer, responses=s.ExperimentSerializer)
    def post(self, request):
        data = _valid(s.ExperimentCreateSerializer, request.data)
        experiment = create_experiment(owner=request.user, **data)
        return Response(
            s.ExperimentSerializer(_experiments().get(pk=experiment.pk)).data,
            status=status.HTTP_201_CREATED,
        )


class ExperimentDetail(generics.RetrieveAPIView):
    serializer_class = s.ExperimentSerializer

    def get_queryset(self):
        return _experiments()

    @extend_schema(request=s.ExperimentShareSerializer, responses=s.ExperimentSerializer)
    def patch(self, request, pk: int):
        """Change whom the experiment is shared with (owner or staff)."""
        experiment = self.get_object()
        data = _valid(s.ExperimentShareSerializer, request.data)
        set_shared_with(user=request.user, experiment=experiment, groups=data["shared_with"])
        return Response(s.ExperimentSerializer(self.get_object()).data)


class RunList(generics.ListAPIView):
    serializer_class = s.RunListSerializer

    def get_queryset(self):
        runs = Run.objects.select_related("owner")
        query = parse_query(RunListQuery, self.request.query_params)
        if query.experiment is not None:
            runs = runs.filter(experiment_id=query.experiment)
        if query.status is not None:
            runs = runs.filter(status=query.status)
        return runs

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(_run_rows(page, self.get_serializer_context()))

    @extend_schema(
        request=s.RunCreateSerializer,
        responses={201: s.RunSerializer, 200: s.RunSerializer},
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description="a retry with the same key returns the same run (200)",
            )
        ],
    )
    def post(self, request):
        """Submit a run. ``Idempotency-Key`` (header): a retry with the key returns
        the run the first request stored (200), never a second one. A broker that
        cannot take the message answers 503; the run is stored, queued, and the
        reconciler publishes it later."""
        data = _valid(s.RunCreateSerializer, request.data)
        data["overrides"] = with_assets(data.pop("model", None), data.pop("dataset", None), data)
        key = lifecycle.check_idempotency_key(request.headers.get("Idempotency-Key"))
        try:
            run = lifecycle.submit_run(
                owner=request.user, idempotency_key=key, raise_on_publish_failure=True, **data
            )
        except PublishFailed as exc:
            run = Run.objects.get(pk=exc.run_id)
            detail = (
                f"the job queue is unreachable; run {run.pk} is stored as queued and will be "
                "sent to a worker when the queue is back"
                + ("" if key else " (send an Idempotency-Key header to retry safely)")
            )
            body = {"detail": detail, "run": s.RunSerializer(run).data}
            return Response(
                body, status=status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": "30"}
            )
        # A retry (the key's run, asking for the same): 200; a new run: 201.
        code = status.HTTP_200_OK if lifecycle.is_replay(run) else status.HTTP_201_CREATED
        return Response(s.RunSerializer(run).data, status=code)


class RunDetail(generics.RetrieveDestroyAPIView):
    queryset = Run.objects.select_related("owner")
    serializer_class = s.RunSerializer

    def destroy(self, request, *args, **kwargs):
        lifecycle.delete_run(self.get_object(), user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class RunCancel(APIView):
    @extend_schema(request=None, responses=s.RunSerializer)
    def post(self, request, pk: int):
        run = lifecycle.cancel_run(get_object_or_404(Run, pk=pk), user=request.user)
        return Response(s.RunSerializer(run).data)


class RunExports(APIView):
    """A finished run's checkpoint as a Hugging Face folder (runs/exports.py)."""

    @extend_schema(responses=s.CheckpointExportSerializer(many=True))
    def get(self, request, pk: int):
        run = get_object_or_404(Run, pk=pk)
        return Response(s.CheckpointExportSerializer(run.exports.all(), many=True).data)

    @extend_schema(request=s.ExportRequestSerializer, responses=s.CheckpointExportSerializer)
    def post(self, request, pk: int):
        run = get_object_or_404(Run, pk=pk)
        data = _valid(s.ExportRequestSerializer, request.data)
        export = exports.request_export(run, user=request.user, dtype=data["dtype"])
        return Response(s.CheckpointExportSerializer(export).data, status=status.HTTP_202_ACCEPTED)


class RunClone(APIView):
    @extend_schema(request=s.CloneSerializer, responses=s.RunSerializer)
    def post(self, request, pk: int):
        source = get_object_or_404(Run, pk=pk)
        data = _valid(s.CloneSerializer, request.data)
        run = lifecycle.clone_run(source, owner=request.user, **data)
        return Response(s.RunSerializer(run).data, status=status.HTTP_201_CREATED)


class RunMetrics(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("keys", str, description="comma-separated metric keys"),
            OpenApiParameter("max_points", int),
            OpenApiParameter("start", int),
            OpenApiParameter("end", int),
        ],
        responses=dict,
    )
    def get(self, request, pk: int):
        run = get_object_or_404(Run, pk=pk)
        query = parse_query(MetricsQuery, request.query_params)
        if not query.keys:
            available = metric_reads.metric_keys(run.pk)
            return Response({"run": run.pk, "available_keys": available})
        data = metric_reads.metric_series(
            run.pk,
            query.keys,
            start=query.start,
            end=query.end,
            max_points=query.max_points or DEFAULT_MAX_POINTS,  # '' parses as not given
        )
        return Response({"run": run.pk, "status": run.status, **data})


class RunComments(generics.ListAPIView):
    """A run's comments, oldest first, paginated like every list."""

    serializer_class = s.CommentSerializer

    def get_queryset(self):
        return Comment.objects.filter(run_id=self.kwargs["pk"]).select_related("author")

    @extend_schema(request=s.CommentCreateSerializer, responses=s.CommentSerializer)
    def post(self, request, pk: int):
        run = get_object_or_404(Run, pk=pk)
        data = _valid(s.CommentCreateSerializer, request.data)
        comment = comments.add_comment(author=request.user, body=data["body"], run=run)
        return Response(s.CommentSerializer(comment).data, status=status.HTTP_201_CREATED)


class SweepCreate(APIView):
    @extend_schema(
        request=s.SweepCreateSerializer,
        responses=dict,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description="a retry with the same key returns the same sweep (200); "
                "another request under the key is a 422",
            )
        ],
    )
    def post(self, request):
        data = _valid(s.SweepCreateSerializer, request.data)
        experiment = data["experiment"]
        base = resolve_config(
            data.get("base_config"), data.get("preset"), base=experiment.base_config or None
        ).to_dict()
        if data["preview"]:
            planned = sweeps.preview_sweep(base, data["grid"], data["seeds"])
            return Response(
                {"count": len(planned), "variants": sorted({label for label, _ in planned})}
            )
        sweep = sweeps.create_sweep(
            owner=request.user,
            experiment=experiment,
            base_config=base,
            grid=data["grid"],
            seeds=data["seeds"],
            queue=data.get("queue"),
            name=data.get("name", ""),
            priority=data.get("priority"),
            idempotency_key=request.headers.get("Idempotency-Key") or "",
        )
        code = status.HTTP_200_OK if lifecycle.is_replay(sweep) else status.HTTP_201_CREATED
        return Response(s.SweepSerializer(sweep).data, status=code)


class SweepAction(APIView):
    """Pause, resume or clear a sweep's unfinished runs (lab.runs.bulk; the queue
    page's buttons): the ids done, left alone (finished or not yours), external."""

    action = ""
    SERVICES = {"pause": bulk.pause_sweep, "resume": bulk.resume_sweep, "clear": bulk.clear_sweep}

    @extend_schema(request=None, responses=dict)
    def post(self, request, pk: int):
        outcome = self.SERVICES[self.action](get_object_or_404(Sweep, pk=pk), user=request.user)
        return Response(
            {
                "sweep": pk,
                "action": self.action,
                "done": outcome.done,
                "skipped": outcome.skipped,
                "external": outcome.external,
            }
        )


def _run_rows(runs, context: dict) -> list[dict]:
    """A page of runs as list rows: their queue positions in one query."""
    context = {**context, "queue_positions": queue_positions(runs)}
    return s.RunListSerializer(runs, many=True, context=context).data


@extend_schema(
    parameters=[OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
    responses=dict,
)
@api_view(["GET"])
def queue_view(request):
    """Queued and running runs in queue order (queue, priority, age), paginated
    like every list: ``{"queues", "count", "next", "previous", "runs"}``."""
    active = in_queue_order(
        Run.objects.filter(status__in=ACTIVE_STATUSES).select_related("owner"), by_queue=True
    )
    paginator = BoundedLimitOffsetPagination()
    page = paginator.paginate_queryset(active, request)
    return Response(
        {
            "queues": settings.LAB_QUEUES,
            "count": paginator.count,
            "next": paginator.get_next_link(),
            "previous": paginator.get_previous_link(),
            "runs": _run_rows(page, {"request": request}),
        }
    )


@extend_schema(responses=dict)
@api_view(["GET"])
def workers_view(request):
    return Response(
        {
            "workers": [
                {
                    "hostname": w.hostname,
                    "queues": w.queues,
                    "gpu_index": w.gpu_index,
                    "gpus": w.gpus,
                    "cpu_slots": w.cpu_slots,
                    "last_seen": w.last_seen,
                    "current_run": w.current_run_id,
                }
                for w in Worker.live()
            ]
        }
    )


def _valid(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)
