"""A run's and a sweep's actions (POST only, CSRF-protected): cancel, delete,
requeue, export, end (an external run); a sweep's cancel, pause, resume and clear; and the bulk cancel /
requeue of ticked runs. Each lives under
its object's URL (``/runs/<id>/cancel``) and goes back to its page; the writes
are the platform's services (lab.runs.lifecycle, bulk, exports).
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Manager
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from lab.experiments.models import Sweep
from lab.experiments.rights import NotAllowed
from lab.jobs.queries import unserved_warning
from lab.runs import bulk, exports, lifecycle
from lab.runs.models import Run, RunStatus
from trainer.errors import FieldError

RUN_PAGE = "dashboard:run"
EXPERIMENT_PAGE = "dashboard:experiment"


def _run_page(run: Run) -> HttpResponse:
    return redirect(RUN_PAGE, run.pk)


def _experiment_page(run: Run) -> HttpResponse:
    return redirect(EXPERIMENT_PAGE, run.experiment_id)


def _lifecycle_action(
    request: HttpRequest,
    pk: int,
    act: Callable[[Run], None],
    done: str,
    *,
    runs: Manager | None = None,
    after: Callable[[Run], HttpResponse] = _run_page,
    on_refusal: Callable[[Run], HttpResponse] = _run_page,
) -> HttpResponse:
    """Apply ``act(run)`` (a lifecycle service) for a run page's button: refused rights
    are a 403, a run in the wrong state a message on ``on_refusal``'s page; ``done`` is
    said on ``after``'s. ``runs``: where the run is looked up (deleted runs included
    for a restore)."""
    run = get_object_or_404(runs if runs is not None else Run.objects, pk=pk)
    try:
        act(run)
    except lifecycle.NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    except lifecycle.InvalidState as exc:
        messages.error(request, str(exc))
        return on_refusal(run)
    messages.info(request, done.format(run=run))
    return after(run)


@login_required
@require_POST
def run_cancel(request, pk: int):
    return _lifecycle_action(
        request,
        pk,
        lambda run: lifecycle.cancel_run(run, user=request.user),
        f"Cancel requested for run {pk}.",
    )


@login_required
@require_POST
def run_export(request, pk: int):
    """Queue a Hugging Face export of a finished run's checkpoint (runs/exports.py)."""
    run = get_object_or_404(Run, pk=pk)
    try:
        export = exports.request_export(
            run, user=request.user, dtype=request.POST.get("dtype", "float32")
        )
    except NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    except FieldError as exc:
        messages.error(request, str(exc))
        return redirect(RUN_PAGE, pk)
    messages.info(request, f"Export of step {export.step} ({export.status}): {export.out_dir}")
    return redirect(RUN_PAGE, pk)


# The ends an owner may give an external run from its page, as MLflow names them.
END_STATUSES = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


@login_required
@require_POST
def run_end(request, pk: int):
    """End an external run that is still running or lost (its trainer elsewhere will
    never say): as succeeded (its collapse is then judged on its metrics), failed or
    cancelled. The run's owner or staff; MLflow's UpdateRun does the write."""
    from lab.tracking import services as tracking
    from lab.tracking.errors import MlflowError

    run = get_object_or_404(Run, pk=pk)
    if not run.can_manage(request.user):
        return HttpResponseForbidden("only the run's owner or staff can end it")
    outcome = request.POST.get("status", "")
    if not run.is_external or run.status not in (RunStatus.RUNNING, RunStatus.LOST):
        messages.error(request, "only an external run still running or lost can be ended here")
    elif outcome not in END_STATUSES:
        messages.error(request, f"status: choose one of {', '.join(END_STATUSES)}")
    else:
        try:
            tracking.update_run(user=request.user, run_id=run.pk, status=END_STATUSES[outcome])
        except MlflowError as exc:
            messages.error(request, exc.message)
        else:
            messages.info(request, f"Run {pk} ended as {outcome}.")
    return redirect(RUN_PAGE, pk)


@login_required
@require_POST
def run_requeue(request, pk: int):
    """Put a failed or cancelled run back in its queue (it resumes from its checkpoint)."""

    def requeue(run: Run) -> None:
        bulk.requeue_run(run, user=request.user)
        warn_if_unserved(request, run.queue)

    return _lifecycle_action(request, pk, requeue, f"Run {pk} is back in the queue {{run.queue}}.")


def _selected_run_ids(request: HttpRequest) -> list[int]:
    """The ticked run ids of a bulk form (non-numbers are ignored: nothing to act on)."""
    return [int(v) for v in request.POST.getlist("runs") if v.isascii() and v.isdigit()]


def _back(request: HttpRequest, default: str):
    """Redirect to the page the bulk form was on (same-site paths only)."""
    target = request.POST.get("next", "")
    return redirect(target if target.startswith("/") and not target.startswith("//") else default)


@login_required
@require_POST
def runs_bulk(request):
    """Cancel or requeue the runs ticked on a list; runs that are finished (for a
    cancel), not finished (for a requeue) or not the user's are left alone."""
    action = request.POST.get("action")
    ids = _selected_run_ids(request)
    if not ids:
        messages.error(request, "Tick at least one run first.")
    elif action == "cancel":
        messages.info(request, bulk.cancel_runs(ids, user=request.user).message("Cancelled"))
    elif action == "requeue":
        messages.info(request, bulk.requeue_runs(ids, user=request.user).message("Requeued"))
    else:
        messages.error(request, "Choose cancel or requeue.")
    return _back(request, reverse("dashboard:runs"))


# A sweep's actions: the service, its verb and what the page adds to the count.
SWEEP_ACTIONS = {
    "cancel": (bulk.cancel_sweep, "cancelled", ""),
    "pause": (bulk.pause_sweep, "paused", " Finished runs are kept; Resume queues the rest again."),
    "resume": (bulk.resume_sweep, "queued again", ""),
    "clear": (
        bulk.clear_sweep,
        "cleared",
        " Waiting runs were deleted, a training one stops; finished runs are kept.",
    ),
}


@login_required
@require_POST
def sweep_action(request, pk: int, action: str):
    """Cancel, pause, resume or clear a sweep's unfinished runs (lab.runs.bulk)."""
    sweep = get_object_or_404(Sweep, pk=pk)
    service, verb, note = SWEEP_ACTIONS[action]
    outcome = service(sweep, user=request.user)
    messages.info(
        request, outcome.message(f"Sweep {sweep.pk}: {verb}") + (note if outcome.done else "")
    )
    return _back(request, reverse(EXPERIMENT_PAGE, args=[sweep.experiment_id]))


def warn_if_unserved(request: HttpRequest, queue: str) -> None:
    warning = unserved_warning(queue)
    if warning:
        messages.warning(request, warning)


@login_required
@require_POST
def run_delete(request, pk: int):
    return _lifecycle_action(
        request,
        pk,
        lambda run: lifecycle.delete_run(run, user=request.user),
        f"Run {pk} deleted; the experiment page's deleted runs can restore it.",
        after=_experiment_page,
    )


@login_required
@require_POST
def run_restore(request, pk: int):
    """Put a deleted run back (lifecycle.restore_run) and open its page."""
    return _lifecycle_action(
        request,
        pk,
        lambda run: lifecycle.restore_run(run, user=request.user),
        f"Run {pk} restored.",
        runs=Run.all_objects,
        on_refusal=_experiment_page,
    )
