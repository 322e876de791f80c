"""Input and output shapes of the API. Inputs reject unknown keys; configs are
validated by the ONE schema inside the services, not here."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from lab.assets.models import RegisteredDataset, RegisteredModel
from lab.experiments.models import Experiment, Sweep
from lab.jobs.queries import eta_seconds, queue_position, waiting_reason
from lab.runs.models import CheckpointExport, Comment, Run


class StrictSerializer(serializers.Serializer):
    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"__all__": ["expected a JSON object"]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({k: ["unknown field"] for k in unknown})
        return super().to_internal_value(data)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "object", "additionalProperties": True},
            {"type": "array", "items": {"type": "string"}},
        ]
    }
)
class OverridesField(serializers.Field):
    """``{"run.steps": 3}`` or ``["run.steps=3"]``."""

    def to_internal_value(self, data):
        if isinstance(data, dict) and all(isinstance(k, str) for k in data):
            return data
        if isinstance(data, list) and all(isinstance(i, str) for i in data):
            return data
        raise serializers.ValidationError(
            "give an object of dotted paths to values, or a list of 'a.b=value' strings"
        )

    def to_representation(self, value):
        return value


class ExperimentCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, max_length=20000)
    tags = serializers.ListField(
        child=serializers.CharField(max_length=50), required=False, max_length=20
    )
    base_config = serializers.DictField(required=False)
    preset = serializers.CharField(required=False, max_length=100)
    overrides = OverridesField(required=False)


class ExperimentShareSerializer(StrictSerializer):
    shared_with = serializers.ListField(
        child=serializers.CharField(max_length=150), max_length=50, allow_empty=True
    )


class RunCreateSerializer(StrictSerializer):
    experiment = serializers.PrimaryKeyRelatedField(queryset=Experiment.objects.all())
    config = serializers.DictField(required=False)
    preset = serializers.CharField(required=False, max_length=100)
    overrides = OverridesField(required=False)
    queue = serializers.CharField(required=False, max_length=64)
    priority = serializers.IntegerField(required=False, min_value=0, max_value=9)
    variant = serializers.CharField(required=False, allow_blank=True, max_length=200)
    model = serializers.SlugRelatedField(
        slug_field="name",
        queryset=RegisteredModel.objects.all(),
        required=False,
        help_text="A registered model's name: sets model.source and its shape fields.",
    )
    dataset = serializers.SlugRelatedField(
        slug_field="name",
        queryset=RegisteredDataset.objects.all(),
        required=False,
        help_text="A registered dataset's name: the run's task becomes a text task on its file.",
    )

    def validate_queue(self, value):
        if value not in settings.LAB_QUEUES:
            raise serializers.ValidationError(
                f"unknown queue '{value}'; choose one of: {', '.join(settings.LAB_QUEUES)}"
            )
        return value


class CloneSerializer(StrictSerializer):
    overrides = OverridesField(required=False)
    queue = serializers.CharField(required=False, max_length=64)


class SweepCreateSerializer(StrictSerializer):
    experiment = serializers.PrimaryKeyRelatedField(queryset=Experiment.objects.all())
    name = serializers.CharField(required=False, allow_blank=True, max_length=200)
    base_config = serializers.DictField(required=False)
    preset = serializers.CharField(required=False, max_length=100)
    grid = serializers.DictField(child=serializers.ListField(allow_empty=False))
    seeds = serializers.ListField(child=serializers.IntegerField(min_value=0), allow_empty=False)
    queue = serializers.CharField(required=False, max_length=64)
    priority = serializers.IntegerField(required=False, min_value=0, max_value=9)
    preview = serializers.BooleanField(required=False, default=False)


class CommentCreateSerializer(StrictSerializer):
    body = serializers.CharField(max_length=10000)


@extend_schema_field(OpenApiTypes.STR)
class UserField(serializers.RelatedField):
    def to_representation(self, value):
        return value.get_username()


class ExperimentSerializer(serializers.ModelSerializer):
    """An experiment; lists annotate ``run_total`` and prefetch ``shared_with`` so
    a page costs the same few queries at any length."""

    owner = UserField(read_only=True)
    run_count = serializers.SerializerMethodField()
    shared_with = serializers.SlugRelatedField(many=True, read_only=True, slug_field="name")

    class Meta:
        model = Experiment
        fields = [
            "id",
            "name",
            "description",
            "owner",
            "tags",
            "base_config",
            "shared_with",
            "created_at",
            "updated_at",
            "run_count",
        ]

    def get_run_count(self, obj) -> int:
        total = getattr(obj, "run_total", None)
        return obj.runs.count() if total is None else total


class RunSerializer(serializers.ModelSerializer):
    owner = UserField(read_only=True)
    progress = serializers.FloatField(read_only=True)
    queue_position = serializers.SerializerMethodField()
    eta_s = serializers.SerializerMethodField()
    waiting_reason = serializers.SerializerMethodField(
        help_text="Why a queued run cannot start now (no live worker serves its queue, or "
        "none owns the GPUs it asks for); null otherwise."
    )

    class Meta:
        model = Run
        fields = [
            "id",
            "experiment",
            "sweep",
            "owner",
            "variant",
            "preset",
            "seed",
            "status",
            "queue",
            "priority",
            "gpus",
            "nodes",
            "gang",
            "rdzv_endpoint",
            "task_id",
            "worker_host",
            "gpu_index",
            "attempts",
            "max_attempts",
            "cancel_requested",
            "paused",
            "created_at",
            "queued_at",
            "started_at",
            "finished_at",
            "heartbeat_at",
            "current_step",
            "total_steps",
            "progress",
            "queue_position",
            "eta_s",
            "waiting_reason",
            "summary",
            "error",
            "field_errors",
            "run_dir",
            "config",
        ]

    def get_queue_position(self, obj) -> int | None:
        # A list computes every row's position in one query (queries.queue_positions)
        # and passes them in the context; a single run asks for its own.
        positions = self.context.get("queue_positions")
        if positions is not None:
            return positions.get(obj.pk)
        return queue_position(obj)

    def get_eta_s(self, obj) -> float | None:
        return eta_seconds(obj)

    def get_waiting_reason(self, obj) -> str | None:
        return waiting_reason(obj)


class RunListSerializer(RunSerializer):
    waiting_reason = None  # reads the live workers: the detail answers it, a list does not

    class Meta(RunSerializer.Meta):
        fields = [
            f
            for f in RunSerializer.Meta.fields
            if f not in ("config", "error", "field_errors", "waiting_reason")
        ]


class SweepSerializer(serializers.ModelSerializer):
    owner = UserField(read_only=True)
    runs = serializers.PrimaryKeyRelatedField(many=True, read_only=True)

    class Meta:
        model = Sweep
        fields = [
            "id",
            "experiment",
            "name",
            "owner",
            "base_config",
            "grid",
            "seeds",
            "queue",
            "created_at",
            "runs",
        ]


class CommentSerializer(serializers.ModelSerializer):
    author = UserField(read_only=True)

    class Meta:
        model = Comment
        fields = ["id", "run", "experiment", "author", "body", "created_at"]


class CheckpointExportSerializer(serializers.ModelSerializer):
    requested_by = UserField(read_only=True)

    class Meta:
        model = CheckpointExport
        fields = [
            "id",
            "run",
            "requested_by",
            "step",
            "dtype",
            "status",
            "out_dir",
            "error",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields


class ExportRequestSerializer(StrictSerializer):
    dtype = serializers.ChoiceField(
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help_text="Weights' dtype in the exported safetensors.",
    )
