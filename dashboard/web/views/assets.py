"""The models & data page: registered models and datasets, and the two registration
forms (writes: lab.assets.services)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from lab.assets import services
from lab.assets.models import RegisteredDataset, RegisteredModel, Verifier
from trainer.errors import FieldError
from trainer.hf.families import FAMILIES
from trainer.model.param_count import format_params

MODEL_FIELDS = ("name", "path", "description")
DATASET_FIELDS = (
    "name",
    "path",
    "prompt_field",
    "answer_field",
    "prompt_template",
    "verifier",
    "description",
)


@login_required
def asset_list(request: HttpRequest) -> HttpResponse:
    """GET lists; POST with ``kind=model|dataset`` registers one (errors by field)."""
    errors: dict[str, str] = {}
    posted: dict[str, str] = {}
    kind = request.POST.get("kind", "")
    if request.method == "POST" and kind in ("model", "dataset"):
        fields = MODEL_FIELDS if kind == "model" else DATASET_FIELDS
        posted = {f: request.POST.get(f, "") for f in fields}
        data = {k: v for k, v in posted.items() if v != "" or k == "prompt_template"}
        try:
            if kind == "model":
                item = services.register_model(owner=request.user, **data)
            else:
                item = services.register_dataset(owner=request.user, **data)
        except FieldError as exc:
            errors = {path: message for path, message in exc.errors}
        else:
            messages.success(request, f"Registered {kind} {item.name}.")
            return redirect("dashboard:assets")
    models = [
        {
            "item": m,
            "total": format_params(m.total_params),
            "active": format_params(m.active_params),
        }
        for m in RegisteredModel.objects.select_related("owner")
    ]
    return render(
        request,
        "dashboard/assets.html",
        {
            "models": models,
            "datasets": RegisteredDataset.objects.select_related("owner"),
            "verifiers": Verifier.choices,
            "kind": kind,
            "posted": posted,
            "errors": errors,
            "families": ", ".join(FAMILIES),
        },
    )
