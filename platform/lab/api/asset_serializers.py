"""API shapes of the registry (inputs reject unknown keys; the files are checked by services)."""

from __future__ import annotations

from rest_framework import serializers

from lab.api.serializers import StrictSerializer, UserField
from lab.assets.models import RegisteredDataset, RegisteredModel, Verifier


class ModelCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)
    path = serializers.CharField(max_length=1000)
    description = serializers.CharField(required=False, allow_blank=True, max_length=5000)


class DatasetCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)
    path = serializers.CharField(max_length=1000)
    prompt_field = serializers.CharField(required=False, max_length=100)
    answer_field = serializers.CharField(required=False, max_length=100)
    prompt_template = serializers.CharField(required=False, allow_blank=True, max_length=5000)
    verifier = serializers.ChoiceField(choices=Verifier.values, required=False)
    description = serializers.CharField(required=False, allow_blank=True, max_length=5000)


class RegisteredModelSerializer(serializers.ModelSerializer):
    owner = UserField(read_only=True)

    class Meta:
        model = RegisteredModel
        fields = [
            "id",
            "name",
            "path",
            "family",
            "total_params",
            "active_params",
            "vocab_size",
            "model_fields",
            "status",
            "error",
            "description",
            "owner",
            "created_at",
        ]
        read_only_fields = ["status", "error"]


class RegisteredDatasetSerializer(serializers.ModelSerializer):
    owner = UserField(read_only=True)

    class Meta:
        model = RegisteredDataset
        fields = [
            "id",
            "name",
            "path",
            "prompt_field",
            "prompt_template",
            "answer_field",
            "verifier",
            "status",
            "error",
            "rows",
            "problems",
            "skipped",
            "description",
            "owner",
            "created_at",
        ]
        read_only_fields = ["status", "error"]
