"""Team review actions (POST only, CSRF-protected): comments, verdicts, saved
comparisons, pinned baselines. Each calls one service in dashboard/review/services.py
and redirects back to the page it came from."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard.review import services
from dashboard.review.models import SavedComparison, Verdict
from lab.experiments.models import Experiment
from lab.inputs.query import ascii_id
from lab.runs.models import Run
from trainer.errors import FieldError


def _error(request: HttpRequest, exc: FieldError) -> None:
    for path, message in exc.errors:
        messages.error(request, f"{path}: {message}")


def _run_url(run: Run, anchor: str = "") -> str:
    return reverse("dashboard:run", args=[run.pk]) + (f"#{anchor}" if anchor else "")


@login_required
@require_POST
def verdict_run(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("experiment"), pk=run_id)
    try:
        services.set_verdict(
            author=request.user,
            run=run,
            label=request.POST.get("label", ""),
            note=request.POST.get("note", ""),
        )
    except FieldError as exc:
        _error(request, exc)
    except services.NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    return redirect(_run_url(run, "review"))


@login_required
@require_POST
def withdraw_verdict(request: HttpRequest, verdict_id: int) -> HttpResponse:
    verdict = get_object_or_404(Verdict.objects.select_related("run"), pk=verdict_id)
    try:
        services.withdraw_verdict(user=request.user, verdict=verdict)
    except services.NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    return redirect(_run_url(verdict.run, "review"))


@login_required
@require_POST
def pin_run(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("experiment"), pk=run_id)
    try:
        services.pin_baseline(user=request.user, run=run)
    except services.NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    messages.success(request, f"Run #{run.pk} is now the baseline of its experiment's charts.")
    return redirect(_run_url(run))


@login_required
@require_POST
def unpin_experiment(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = get_object_or_404(Experiment, pk=experiment_id)
    try:
        services.unpin_baseline(user=request.user, experiment=experiment)
    except services.NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    back = request.POST.get("next", "")
    if back.startswith("/") and not back.startswith("//"):
        return redirect(back)
    return redirect(reverse("dashboard:experiment", args=[experiment.pk]))


def _ids(raw: str) -> list[int]:
    ids = (ascii_id(p) for p in raw.replace(" ", "").split(","))
    return [i for i in ids if i is not None]


@login_required
@require_POST
def save_comparison(request: HttpRequest) -> HttpResponse:
    run_ids = _ids(request.POST.get("runs", ""))
    baseline = request.POST.get("baseline", "").strip()
    try:
        comparison = services.save_comparison(
            owner=request.user,
            name=request.POST.get("name", ""),
            run_ids=run_ids,
            baseline_id=ascii_id(baseline),
        )
    except FieldError as exc:
        _error(request, exc)
        query = f"?runs={','.join(map(str, run_ids))}" if run_ids else ""
        return redirect(reverse("dashboard:compare") + query)
    messages.success(request, "Comparison saved; share this page's address.")
    return redirect(comparison.get_absolute_url())


@login_required
@require_POST
def delete_comparison(request: HttpRequest, comparison_id: int) -> HttpResponse:
    comparison = get_object_or_404(SavedComparison, pk=comparison_id)
    try:
        services.delete_comparison(user=request.user, comparison=comparison)
    except services.NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    messages.success(request, f"Deleted the comparison '{comparison.name}'.")
    return redirect(reverse("dashboard:comparisons"))


@login_required
@require_POST
def comment_comparison(request: HttpRequest, comparison_id: int) -> HttpResponse:
    comparison = get_object_or_404(SavedComparison, pk=comparison_id)
    try:
        services.comment_on_comparison(
            author=request.user, comparison=comparison, body=request.POST.get("body", "")
        )
    except FieldError as exc:
        _error(request, exc)
    return redirect(comparison.get_absolute_url() + "#comments")
