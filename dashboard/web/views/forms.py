"""The forms: experiments (list and create), the run form and an experiment's
sharing (the sweep builder: sweep_builder.py). Every page needs login; writes go through the
platform's services, so the form, the API and the CLI validate and store the
same way.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import (
    Http404,
    JsonResponse,
)
from django.shortcuts import get_object_or_404, redirect, render

from dashboard.web import schema_form
from dashboard.web.views.actions import EXPERIMENT_PAGE, RUN_PAGE, warn_if_unserved
from lab.assets.models import RegisteredDataset, RegisteredModel
from lab.assets.services import picked_assets
from lab.configs import resolve_config
from lab.experiments.models import Experiment
from lab.experiments.rights import NotAllowed, can_queue, can_share
from lab.experiments.services import create_experiment, set_shared_with, shareable_groups
from lab.inputs import json_input
from lab.inputs.query import ascii_id
from lab.runs import lifecycle
from lab.runs.models import Run
from trainer.config.presets import list_presets, preset_dict
from trainer.errors import FieldError

PRIORITY_TEXT = re.compile(r"-?[0-9]{1,4}")
EXPERIMENTS_PER_PAGE = 50


@login_required
def home(request):
    return redirect("dashboard:experiments")


@login_required
def experiment_list(request):
    errors: dict[str, list[str]] = {}
    if request.method == "POST":
        try:
            exp = create_experiment(
                owner=request.user,
                name=request.POST.get("name", ""),
                description=request.POST.get("description", ""),
                tags=[t.strip() for t in request.POST.get("tags", "").split(",") if t.strip()],
                preset=request.POST.get("preset") or None,
            )
            return redirect(EXPERIMENT_PAGE, exp.pk)
        except FieldError as exc:
            errors = exc.as_dict()
    experiments = (
        Experiment.objects.select_related("owner")
        .annotate(run_total=Count("runs"))
        .order_by("-created_at", "-pk")
    )
    page = Paginator(experiments, EXPERIMENTS_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "dashboard/experiment_list.html",
        {
            "experiments": page.object_list,
            "page": page,
            "presets": list_presets(),
            "errors": errors,
            "form": request.POST,
        },
    )


def _initial_config(request, experiment: Experiment) -> tuple[dict[str, Any], str, Run | None]:
    """Config the form starts from: a cloned run, a picked preset, or the experiment's base."""
    clone = None
    preset = request.GET.get("preset", "")
    clone_id = ascii_id(request.GET.get("clone", ""))
    if clone_id is not None:
        clone = get_object_or_404(Run, pk=clone_id)
        return clone.config, clone.preset, clone
    if preset:
        try:
            return resolve_config(preset=preset).to_dict(), preset, None
        except FieldError as exc:
            messages.error(request, str(exc))
    return resolve_config(base=experiment.base_config or None).to_dict(), "", None


def _posted_reference(request, experiment: Experiment) -> tuple[dict[str, Any], str, Run | None]:
    """The reference a submitted form was started from (its hidden ``start_preset`` /
    ``start_clone``), so the change counts stay against the same config after an error."""
    clone_ref = request.POST.get("start_clone", "")
    if clone_ref.isascii() and clone_ref.isdigit():
        clone = Run.objects.filter(pk=int(clone_ref)).first()
        if clone is not None:
            return clone.config, clone.preset, clone
    preset = request.POST.get("start_preset", "")
    if preset:
        try:
            return resolve_config(preset=preset).to_dict(), preset, None
        except FieldError:
            pass
    return resolve_config(base=experiment.base_config or None).to_dict(), "", None


def _with_form_fields(model: RegisteredModel) -> RegisteredModel:
    """The model with ``form_fields``: the run form's fields it sets (JSON, for
    run_form.js), ``model.source`` and the checkpoint's shape, a section's fields
    (``model.mla``, ``model.router``, ...) by their dotted paths."""
    fields: dict[str, object] = {"model.source": model.path}

    def add(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                add(f"{prefix}.{key}", inner)
        else:
            fields[prefix] = value

    for key, value in model.model_fields.items():
        add(f"model.{key}", value)
    model.form_fields = json.dumps(fields)
    return model


def _errors_of_a_refused_config(sections, run: Run) -> list[str]:
    """The errors ``run`` failed on, put at their fields; the ones no field
    claims (the config as a whole, an unknown key), as lines."""
    errors = [(path, m) for path, messages in run.field_errors.items() for m in messages]
    whole = [f"run #{run.pk} failed on its config: {m}" for p, m in errors if p == "__all__"]
    return whole + schema_form.attach_errors(sections, [e for e in errors if e[0] != "__all__"])


def typed_priority(raw: str) -> int | str:
    """The typed priority as an int, or the text as typed (check_priority then names it)."""
    text = raw.strip() or str(lifecycle.DEFAULT_PRIORITY)
    return int(text) if PRIORITY_TEXT.fullmatch(text) else text


@login_required
def run_new(request, pk: int):
    """The run form: key fields first, the other sections collapsed with their change
    counts, the changes from the preset, an error summary; POST queues the run."""
    experiment = get_object_or_404(Experiment, pk=pk)
    sections = schema_form.with_key_section(schema_form.build_sections())
    other_errors: list[str] = []
    mode = request.POST.get("mode", "form")
    priority_text = str(lifecycle.DEFAULT_PRIORITY)
    if request.method == "POST":
        reference, preset, clone = _posted_reference(request, experiment)
        queue = request.POST.get("queue")
        priority_text = request.POST.get("priority", "").strip()[:20] or priority_text
        config: Any
        if mode == "json":
            try:
                config = json_input.loads(request.POST.get("config_json", ""))
            except ValueError as exc:  # bad JSON, nested too deep, or Infinity/NaN
                config = None
                other_errors.append(f"config: not valid JSON ({exc})")
        else:
            config = schema_form.config_from_post(sections, request.POST)
        priority = typed_priority(priority_text)
        if not isinstance(priority, int):
            other_errors.append("priority: priority must be an integer from 0 to 9")
        try:  # a registered model / dataset stands for overrides of the config
            overrides = picked_assets(request.POST)
        except FieldError as exc:
            overrides = None
            other_errors += [f"{path}: {message}" for path, message in exc.errors]
        if other_errors and config is not None:
            # Every kind of error in one submit: the config's own errors with the
            # priority's and the picked assets', not instead of them.
            try:
                resolve_config(config, base=experiment.base_config or None)
            except FieldError as exc:
                other_errors += schema_form.attach_errors(sections, exc.errors)
        if not other_errors:
            try:
                run = lifecycle.submit_run(
                    owner=request.user,
                    experiment=experiment,
                    config=config,
                    overrides=overrides,
                    queue=queue,
                    priority=priority,
                    variant=request.POST.get("variant", "")[:200],
                )
                messages.success(request, f"Run {run.pk} queued on {run.queue}.")
                warn_if_unserved(request, run.queue)
                return redirect(RUN_PAGE, run.pk)
            except FieldError as exc:
                other_errors += schema_form.attach_errors(sections, exc.errors)
            except NotAllowed as exc:
                other_errors.append(str(exc))
        shown = config if isinstance(config, dict) else {}
        schema_form.fill(sections, shown)
        json_text = request.POST.get("config_json") or json.dumps(shown, indent=2)
    else:
        reference, preset, clone = _initial_config(request, experiment)
        if clone:
            priority_text = str(lifecycle.clone_priority(clone, request.user))
        schema_form.fill(sections, reference)
        if clone is not None and clone.failed_on_config:  # "Clone and fix"
            other_errors += _errors_of_a_refused_config(sections, clone)
        json_text = json.dumps(reference, indent=2)
    schema_form.set_reference(sections, reference)
    error_fields = schema_form.error_fields(sections)
    priority_error = any(e.startswith("priority:") for e in other_errors)
    # The page opens at the first error: that field gets autofocus (its section is open).
    first_error = error_fields[0].path if error_fields else ("priority" if priority_error else "")
    return render(
        request,
        "dashboard/run_new.html",
        {
            "experiment": experiment,
            "sections": sections,
            "presets": list_presets(),
            "preset": preset,
            "clone": clone,
            "reference_name": f"run #{clone.pk}" if clone else (preset or "the experiment's base"),
            "queues": settings.LAB_QUEUES,
            "queue": request.POST.get("queue")
            or (clone.queue if clone else settings.LAB_DEFAULT_QUEUE),
            "priority": priority_text,
            "other_errors": other_errors,
            "error_fields": error_fields,
            "first_error": first_error,
            "error_count": len(other_errors) + sum(len(f.errors) for f in error_fields),
            "changes": schema_form.changes(sections),
            "json_text": json_text,
            "mode": mode,
            "bool_marker": schema_form.BOOL_MARKER,
            "variant": request.POST.get("variant", clone.variant if clone else preset),
            "registered_models": [_with_form_fields(m) for m in RegisteredModel.objects.all()],
            "registered_datasets": RegisteredDataset.objects.all(),
            "registered_model": request.POST.get("registered_model", ""),
            "registered_dataset": request.POST.get("registered_dataset", ""),
        },
    )


@login_required
def experiment_sharing(request, pk: int):
    """Whom an experiment is shared with: its owner (or staff) ticks their groups;
    everyone else sees the list. Members may queue, pin and give verdicts."""
    experiment = get_object_or_404(Experiment.objects.select_related("owner"), pk=pk)
    errors: list[str] = []
    editable = can_share(request.user, experiment)
    if request.method == "POST":
        try:
            set_shared_with(
                user=request.user, experiment=experiment, groups=request.POST.getlist("groups")
            )
            messages.success(request, "Sharing saved.")
            return redirect("dashboard:experiment_sharing", pk)
        except NotAllowed as exc:
            errors.append(str(exc))
        except FieldError as exc:
            errors += [m for _, m in exc.errors]
    shared = set(experiment.shared_with.values_list("name", flat=True))
    choices = (
        list(shareable_groups(request.user).values_list("name", flat=True)) if editable else []
    )
    return render(
        request,
        "dashboard/experiment_sharing.html",
        {
            "experiment": experiment,
            "shared": sorted(shared),
            "choices": [(name, name in shared) for name in choices],
            "editable": editable,
            "can_queue": can_queue(request.user, experiment),
            "errors": errors,
        },
        status=403 if errors and not editable else 200,
    )


@login_required
def run_new_any(request):
    """ "New run" from the runs list: the form of the chosen experiment (or the newest)."""
    experiments = Experiment.objects.order_by("-created_at")
    ref = ascii_id(request.GET.get("into", ""))
    experiment = (experiments.filter(pk=ref).first() if ref is not None else None) or (
        experiments.first()
    )
    if experiment is None:
        messages.info(request, "Create an experiment first; its runs are compared together.")
        return redirect("dashboard:experiments")
    return redirect("dashboard:run_new", experiment.pk)


@login_required
def preset_json(request, name: str):
    """The preset's partial config (used by the advanced editor's preset picker)."""
    try:
        data = preset_dict(name)
    except FieldError:
        raise Http404 from None
    return JsonResponse(data)
