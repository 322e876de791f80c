"""Input and output shapes of the API. Inputs reject unknown keys; configs are
validated by the ONE schema inside the services, not here."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from experiments.models import Experiment, Sweep
from runs.models import Comment, Run
from runs.queries import eta_seconds, queue_position


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


class RunCreateSerializer(StrictSerializer):
    experiment = serializers.PrimaryKeyRelatedField(queryset=Experiment.objects.all())
    config = serializers.DictField(required=False)
    preset = serializers.CharField(required=False, max_length=100)
    overrides = OverridesField(required=False)
    queue = serializers.CharField(required=False, max_length=64)
    priority = serializers.IntegerField(required=False, min_value=0, max_value=9)
    variant = serializers.CharField(required=False, allow_blank=True, max_length=200)

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
    preview = serializers.BooleanField(required=False, default=False)


class CommentCreateSerializer(StrictSerializer):
    body = serializers.CharField(max_length=10000)


@extend_schema_field(OpenApiTypes.STR)
class UserField(serializers.RelatedField):
    def to_representation(self, value):
        return value.get_username()


class ExperimentSerializer(serializers.ModelSerializer):
    owner = UserField(read_only=True)
    run_count = serializers.SerializerMethodField()

    class Meta:
        model = Experiment
        fields = [
            "id", "name", "description", "owner", "tags", "base_config",
            "created_at", "updated_at", "run_count",
        ]  # fmt: skip

    def get_run_count(self, obj) -> int:
        return obj.runs.count()


class RunSerializer(serializers.ModelSerializer):
    owner = UserField(read_only=True)
    progress = serializers.FloatField(read_only=True)
    queue_position = serializers.SerializerMethodField()
    eta_s = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id", "experiment", "sweep", "owner", "variant", "preset", "seed", "status",
            "queue", "priority", "task_id", "worker_host", "gpu_index", "attempts",
            "max_attempts", "cancel_requested", "created_at", "queued_at", "started_at",
            "finished_at", "heartbeat_at", "current_step", "total_steps", "progress",
            "queue_position", "eta_s", "summary", "error", "run_dir", "config",
        ]  # fmt: skip

    def get_queue_position(self, obj) -> int | None:
        return queue_position(obj)

    def get_eta_s(self, obj) -> float | None:
        return eta_seconds(obj)


class RunListSerializer(RunSerializer):
    class Meta(RunSerializer.Meta):
        fields = [f for f in RunSerializer.Meta.fields if f not in ("config", "error")]


class SweepSerializer(serializers.ModelSerializer):
    owner = UserField(read_only=True)
    runs = serializers.PrimaryKeyRelatedField(many=True, read_only=True)

    class Meta:
        model = Sweep
        fields = ["id", "experiment", "name", "owner", "base_config", "grid", "seeds", "queue",
                  "created_at", "runs"]  # fmt: skip


class CommentSerializer(serializers.ModelSerializer):
    author = UserField(read_only=True)

    class Meta:
        model = Comment
        fields = ["id", "run", "experiment", "author", "body", "created_at"]
