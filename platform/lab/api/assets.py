"""REST endpoints of the registry: /api/models and /api/datasets (list, register, detail)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response

from lab.api import asset_serializers as s
from lab.assets import services
from lab.assets.models import RegisteredDataset, RegisteredModel
from lab.configs import overrides_as_strings


def _valid(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class ModelList(generics.ListAPIView):
    """Registered checkpoints; POST registers one after checking its folder (the
    folder exists, config.json is a supported family, the tokenizer loads)."""

    queryset = RegisteredModel.objects.select_related("owner")
    serializer_class = s.RegisteredModelSerializer

    @extend_schema(request=s.ModelCreateSerializer, responses={201: s.RegisteredModelSerializer})
    def post(self, request):
        data = _valid(s.ModelCreateSerializer, request.data)
        model = services.register_model(owner=request.user, **data)
        return Response(s.RegisteredModelSerializer(model).data, status=status.HTTP_201_CREATED)


class ModelDetail(generics.RetrieveAPIView):
    queryset = RegisteredModel.objects.select_related("owner")
    serializer_class = s.RegisteredModelSerializer


class DatasetList(generics.ListAPIView):
    """Registered data files; POST registers one after checking it (it exists,
    parses, and its rows have the named fields)."""

    queryset = RegisteredDataset.objects.select_related("owner")
    serializer_class = s.RegisteredDatasetSerializer

    @extend_schema(
        request=s.DatasetCreateSerializer, responses={201: s.RegisteredDatasetSerializer}
    )
    def post(self, request):
        data = _valid(s.DatasetCreateSerializer, request.data)
        dataset = services.register_dataset(owner=request.user, **data)
        return Response(s.RegisteredDatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)


class DatasetDetail(generics.RetrieveAPIView):
    queryset = RegisteredDataset.objects.select_related("owner")
    serializer_class = s.RegisteredDatasetSerializer


def with_assets(
    model: RegisteredModel | None, dataset: RegisteredDataset | None, data: dict[str, Any]
) -> list[str] | Any:
    """A run request's overrides with the picked model's and dataset's first, so
    the request's own overrides still win; unchanged when none is picked."""
    overrides = data.get("overrides")
    if model is None and dataset is None:
        return overrides
    return services.asset_overrides(model, dataset) + overrides_as_strings(overrides)
