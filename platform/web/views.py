"""Browser pages. Every page needs login; writes go through the services, so
the form, the API and the CLI validate and store the same way."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseForbidden, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from experiments.models import Experiment
from experiments.services import create_experiment
from jobs.models import Worker
from runs import services
from runs.configs import resolve_config
from runs.models import ACTIVE_STATUSES, Run
from runs.queries import eta_seconds, placement_text, queue_position
from trainer.config import ConfigError
from trainer.presets import list_presets, preset_dict
from web import schema_form


@login_required
def home(request):
    return redirect("web:experiments")


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
            return redirect("web:experiment", pk=exp.pk)
        except ConfigError as exc:
            errors = exc.as_dict()
    experiments = Experiment.objects.select_related("owner").order_by("-created_at")
    return render(
        request,
        "web/experiment_list.html",
        {"experiments": experiments, "presets": list_presets(), "errors": errors,
         "form": request.POST},
    )  # fmt: skip


@login_required
def experiment_detail(request, pk: int):
    experiment = get_object_or_404(Experiment.objects.select_related("owner"), pk=pk)
    if request.method == "POST":
        try:
            services.add_comment(
                author=request.user, body=request.POST.get("body", ""), experiment=experiment
            )
        except ConfigError as exc:
            messages.error(request, "; ".join(m for _, m in exc.errors))
        return redirect("web:experiment", pk=pk)
    runs = experiment.runs.select_related("owner").order_by("-created_at")
    return render(
        request,
        "web/experiment_detail.html",
        {"experiment": experiment, "runs": runs, "sweeps": experiment.sweeps.all(),
         "comments": experiment.comments.select_related("author")},
    )  # fmt: skip


def _initial_config(request, experiment: Experiment) -> tuple[dict[str, Any], str, Run | None]:
    """Config the form starts from: a cloned run, a picked preset, or the experiment's base."""
    clone = None
    preset = request.GET.get("preset", "")
    if request.GET.get("clone", "").isdigit():
        clone = get_object_or_404(Run, pk=int(request.GET["clone"]))
        return clone.config, clone.preset, clone
    if preset:
        try:
            return resolve_config(preset=preset).to_dict(), preset, None
        except ConfigError as exc:
            messages.error(request, str(exc))
    return resolve_config(base=experiment.base_config or None).to_dict(), "", None


@login_required
def run_new(request, pk: int):
    """The schema-generated form (and its advanced JSON editor); POST queues the run."""
    experiment = get_object_or_404(Experiment, pk=pk)
    sections = schema_form.build_sections()
    other_errors: list[str] = []
    mode = request.POST.get("mode", "form")
    if request.method == "POST":
        queue = request.POST.get("queue")
        priority_raw = request.POST.get("priority", "0").strip() or "0"
        config: Any
        if mode == "json":
            try:
                config = json.loads(request.POST.get("config_json", ""))
            except json.JSONDecodeError as exc:
                config = None
                other_errors.append(f"config: not valid JSON ({exc})")
        else:
            config = schema_form.config_from_post(sections, request.POST)
        if not other_errors:
            try:
                priority = int(priority_raw) if priority_raw.lstrip("-").isdigit() else -1
                run = services.submit_run(
                    owner=request.user,
                    experiment=experiment,
                    config=config,
                    queue=queue,
                    priority=priority,
                    variant=request.POST.get("variant", "")[:200],
                )
                messages.success(request, f"Run {run.pk} queued on {run.queue}.")
                return redirect("web:run", pk=run.pk)
            except ConfigError as exc:
                other_errors += schema_form.attach_errors(sections, exc.errors)
        shown = config if isinstance(config, dict) else {}
        schema_form.fill(sections, shown)
        json_text = request.POST.get("config_json") or json.dumps(shown, indent=2)
        preset, clone = "", None
    else:
        initial, preset, clone = _initial_config(request, experiment)
        schema_form.fill(sections, initial)
        json_text = json.dumps(initial, indent=2)
    return render(
        request,
        "web/run_new.html",
        {
            "experiment": experiment,
            "sections": sections,
            "presets": list_presets(),
            "preset": preset,
            "clone": clone,
            "queues": settings.LAB_QUEUES,
            "queue": request.POST.get("queue")
            or (clone.queue if clone else settings.LAB_DEFAULT_QUEUE),
            "other_errors": other_errors,
            "json_text": json_text,
            "mode": mode,
            "bool_marker": schema_form.BOOL_MARKER,
            "variant": request.POST.get("variant", clone.variant if clone else preset),
        },
    )


@login_required
def run_detail(request, pk: int):
    run = get_object_or_404(Run.objects.select_related("owner", "experiment"), pk=pk)
    if request.method == "POST":
        try:
            services.add_comment(author=request.user, body=request.POST.get("body", ""), run=run)
        except ConfigError as exc:
            messages.error(request, "; ".join(m for _, m in exc.errors))
        return redirect("web:run", pk=pk)
    return render(
        request,
        "web/run_detail.html",
        {
            "run": run,
            "can_manage": run.can_manage(request.user),
            "placement": placement_text(run),
            "config_json": json.dumps(run.config, indent=2),
            "summary_json": json.dumps(run.summary, indent=2) if run.summary else "",
            "comments": run.comments.select_related("author"),
        },
    )


@login_required
@require_POST
def run_cancel(request, pk: int):
    run = get_object_or_404(Run, pk=pk)
    try:
        services.cancel_run(run, user=request.user)
    except services.NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    messages.info(request, f"Cancel requested for run {pk}.")
    return redirect("web:run", pk=pk)


@login_required
@require_POST
def run_delete(request, pk: int):
    run = get_object_or_404(Run, pk=pk)
    experiment_id = run.experiment_id
    try:
        services.delete_run(run, user=request.user)
    except services.NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    except services.InvalidState as exc:
        messages.error(request, str(exc))
        return redirect("web:run", pk=pk)
    messages.info(request, f"Run {pk} deleted.")
    return redirect("web:experiment", pk=experiment_id)


def _parse_values(text: str) -> list[Any]:
    """'none, r3' or '[0.1, 0.2]' -> typed list (JSON where an item parses)."""
    text = text.strip()
    if text.startswith("["):
        try:
            values = json.loads(text)
            return values if isinstance(values, list) else [values]
        except json.JSONDecodeError:
            pass
    out = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        try:
            out.append(json.loads(item))
        except json.JSONDecodeError:
            out.append(item)
    return out


@login_required
def sweep_new(request, pk: int):
    """Sweep builder: a base (preset or the experiment's config), rows of field x
    values, seeds; Preview counts and validates every run, Create queues them."""
    experiment = get_object_or_404(Experiment, pk=pk)
    paths = schema_form.field_paths(schema_form.build_sections())
    data = request.POST if request.method == "POST" else request.GET
    rows = [(data.get(f"field_{i}", ""), data.get(f"values_{i}", "")) for i in range(4)]
    preview = None
    errors: list[str] = []
    if request.method == "POST":
        grid = {f: _parse_values(v) for f, v in rows if f}
        seeds = _parse_values(data.get("seeds", "0"))
        try:
            base = resolve_config(
                preset=data.get("preset") or None, base=experiment.base_config or None
            ).to_dict()
            planned = services.preview_sweep(base, grid, seeds)
            if data.get("action") == "create":
                sweep = services.create_sweep(
                    owner=request.user, experiment=experiment, base_config=base, grid=grid,
                    seeds=seeds, queue=data.get("queue"), name=data.get("name", ""),
                )  # fmt: skip
                messages.success(request, f"Sweep queued: {sweep.runs.count()} runs.")
                return redirect("web:experiment", pk=pk)
            preview = {"count": len(planned), "variants": sorted({label for label, _ in planned})}
        except ConfigError as exc:
            errors = [f"{p}: {m}" for p, m in exc.errors]
    return render(
        request,
        "web/sweep_new.html",
        {"experiment": experiment, "paths": paths, "rows": rows, "preview": preview,
         "errors": errors, "presets": list_presets(), "queues": settings.LAB_QUEUES,
         "data": data},
    )  # fmt: skip


@login_required
def queue_page(request):
    active = list(
        Run.objects.filter(status__in=ACTIVE_STATUSES)
        .select_related("owner", "experiment")
        .order_by("queue", "-priority", "created_at")
    )
    rows = [{"run": r, "position": queue_position(r), "eta": eta_seconds(r)} for r in active]
    return render(request, "web/queue.html", {"rows": rows})


@login_required
def workers_page(request):
    workers = Worker.live().select_related("current_run")
    return render(request, "web/workers.html", {"workers": workers})


@login_required
def preset_json(request, name: str):
    """The preset's partial config (used by the advanced editor's preset picker)."""
    try:
        data = preset_dict(name)
    except ConfigError:
        raise Http404 from None
    return JsonResponse(data)
