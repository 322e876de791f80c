"""REST API (DESIGN.md 3.3). Views parse and authorise; services write."""

from __future__ import annotations

import re

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from api import serializers as s
from dashboard.downsample import MIN_POINTS
from experiments.models import Experiment
from experiments.services import create_experiment
from jobs.health import health
from jobs.models import Worker
from runs import queries
from runs import services as run_services
from runs.configs import resolve_config
from runs.models import ACTIVE_STATUSES, Comment, Run, RunStatus
from trainer.config import ConfigError, json_schema
from trainer.presets import list_presets, preset_dict

METRIC_KEY = re.compile(r"^[A-Za-z0-9_./-]{1,100}$")
MAX_METRIC_KEYS = 64


@extend_schema(responses=dict)
@api_view(["GET"])
def health_view(request):
    report = health()
    return Response(report, status=200 if report["ok"] else 503)


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


class ExperimentList(generics.ListAPIView):
    queryset = Experiment.objects.select_related("owner")
    serializer_class = s.ExperimentSerializer

    @extend_schema(request=s.ExperimentCreateSerializer, responses=s.ExperimentSerializer)
    def post(self, request):
        data = _valid(s.ExperimentCreateSerializer, request.data)
        experiment = create_experiment(owner=request.user, **data)
        return Response(s.ExperimentSerializer(experiment).data, status=status.HTTP_201_CREATED)


class ExperimentDetail(generics.RetrieveAPIView):
    queryset = Experiment.objects.select_related("owner")
    serializer_class = s.ExperimentSerializer


class RunList(generics.ListAPIView):
    serializer_class = s.RunListSerializer

    def get_queryset(self):
        runs = Run.objects.select_related("owner")
        params = self.request.query_params
        if params.get("experiment", "").isdigit():
            runs = runs.filter(experiment_id=int(params["experiment"]))
        if params.get("status") in RunStatus.values:
            runs = runs.filter(status=params["status"])
        return runs

    @extend_schema(request=s.RunCreateSerializer, responses=s.RunSerializer)
    def post(self, request):
        data = _valid(s.RunCreateSerializer, request.data)
        run = run_services.submit_run(owner=request.user, **data)
        return Response(s.RunSerializer(run).data, status=status.HTTP_201_CREATED)


class RunDetail(generics.RetrieveDestroyAPIView):
    queryset = Run.objects.select_related("owner")
    serializer_class = s.RunSerializer

    def destroy(self, request, *args, **kwargs):
        run_services.delete_run(self.get_object(), user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class RunCancel(APIView):
    @extend_schema(request=None, responses=s.RunSerializer)
    def post(self, request, pk: int):
        run = run_services.cancel_run(get_object_or_404(Run, pk=pk), user=request.user)
        return Response(s.RunSerializer(run).data)


class RunClone(APIView):
    @extend_schema(request=s.CloneSerializer, responses=s.RunSerializer)
    def post(self, request, pk: int):
        source = get_object_or_404(Run, pk=pk)
        data = _valid(s.CloneSerializer, request.data)
        run = run_services.clone_run(source, owner=request.user, **data)
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
        params = request.query_params
        errors: dict[str, list[str]] = {}
        keys = [k for k in params.get("keys", "").split(",") if k]
        if not keys:
            available = queries.metric_keys(run.pk)
            return Response({"run": run.pk, "available_keys": available})
        bad = [k for k in keys if not METRIC_KEY.match(k)]
        if bad:
            errors["keys"] = [f"not a metric key: {bad[0][:100]!r}"]
        if len(keys) > MAX_METRIC_KEYS:
            errors["keys"] = [f"at most {MAX_METRIC_KEYS} keys per request"]
        ints = {}
        for name, low, high, default in (
            ("max_points", MIN_POINTS, 100_000, 1000),
            ("start", 0, 10**9, None),
            ("end", 0, 10**9, None),
        ):
            raw = params.get(name)
            if raw is None or raw == "":
                ints[name] = default
            elif not re.fullmatch(r"\d{1,10}", raw) or not low <= int(raw) <= high:
                errors[name] = [f"an integer from {low} to {high}"]
            else:
                ints[name] = int(raw)
        if errors:
            raise ConfigError([(k, m) for k, msgs in errors.items() for m in msgs])
        data = queries.metric_series(
            run.pk,
            keys,
            start=ints["start"],
            end=ints["end"],
            max_points=ints["max_points"],
        )
        return Response({"run": run.pk, "status": run.status, **data})


class RunComments(generics.ListAPIView):
    serializer_class = s.CommentSerializer
    pagination_class = None

    def get_queryset(self):
        return Comment.objects.filter(run_id=self.kwargs["pk"]).select_related("author")

    @extend_schema(request=s.CommentCreateSerializer, responses=s.CommentSerializer)
    def post(self, request, pk: int):
        run = get_object_or_404(Run, pk=pk)
        data = _valid(s.CommentCreateSerializer, request.data)
        comment = run_services.add_comment(author=request.user, body=data["body"], run=run)
        return Response(s.CommentSerializer(comment).data, status=status.HTTP_201_CREATED)


class SweepCreate(APIView):
    @extend_schema(request=s.SweepCreateSerializer, responses=dict)
    def post(self, request):
        data = _valid(s.SweepCreateSerializer, request.data)
        experiment = data["experiment"]
        base = resolve_config(
            data.get("base_config"), data.get("preset"), base=experiment.base_config or None
        ).to_dict()
        if data["preview"]:
            planned = run_services.preview_sweep(base, data["grid"], data["seeds"])
            return Response(
                {"count": len(planned), "variants": sorted({label for label, _ in planned})}
            )
        sweep = run_services.create_sweep(
            owner=request.user,
            experiment=experiment,
            base_config=base,
            grid=data["grid"],
            seeds=data["seeds"],
            queue=data.get("queue"),
            name=data.get("name", ""),
        )
        return Response(s.SweepSerializer(sweep).data, status=status.HTTP_201_CREATED)


@extend_schema(responses=dict)
@api_view(["GET"])
def queue_view(request):
    active = Run.objects.filter(status__in=ACTIVE_STATUSES).order_by(
        "queue", "-priority", "created_at"
    )
    return Response(
        {
            "queues": settings.LAB_QUEUES,
            "runs": s.RunListSerializer(active, many=True).data,
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
