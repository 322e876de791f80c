"""The queue (queued and running runs in queue order) and the live workers."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.shortcuts import render

from lab.experiments.models import Sweep
from lab.jobs.models import Worker
from lab.jobs.queries import eta_seconds, queue_positions, served_queues, unserved_warning
from lab.runs.demo import DEMO_PRIORITY, demo_experiment
from lab.runs.models import ACTIVE_STATUSES, Run, RunOrigin, RunStatus
from lab.runs.queue_order import in_queue_order

QUEUE_PAGE_SIZE = 100


@login_required
def queue_page(request):
    """Queued and running runs in queue order, a page at a time; the same few
    queries at any queue length (positions: one query for the page). External
    runs (trained elsewhere, logged here) hold no place in the lab's queues."""
    active = in_queue_order(
        Run.objects.filter(status__in=ACTIVE_STATUSES, origin=RunOrigin.LAB).select_related(
            "owner", "experiment"
        ),
        by_queue=True,
    )
    page = Paginator(active, QUEUE_PAGE_SIZE).get_page(request.GET.get("page"))
    positions = queue_positions(page.object_list)
    rows = [
        {"run": r, "position": positions.get(r.pk), "eta": eta_seconds(r)} for r in page.object_list
    ]
    waiting_queues = set(
        Run.objects.filter(status="queued").values_list("queue", flat=True).distinct()
    )
    sweeps_active = list(
        Sweep.objects.filter(runs__status__in=ACTIVE_STATUSES, runs__origin=RunOrigin.LAB)
        .annotate(
            active=Count("runs"),
            paused=Count("runs", filter=Q(runs__paused=True, runs__status=RunStatus.QUEUED)),
            training=Count("runs", filter=Q(runs__status=RunStatus.RUNNING)),
        )
        .select_related("experiment")
        .order_by("pk")
    )
    demo = demo_experiment()
    return render(
        request,
        "dashboard/queue.html",
        {
            "rows": rows,
            "page": page,
            "unserved": [unserved_warning(q) for q in sorted(waiting_queues - served_queues())],
            "sweeps": sweeps_active,
            "demo_sweeps": [sw for sw in sweeps_active if demo and sw.experiment_id == demo.pk],
            "demo_priority": DEMO_PRIORITY,
        },
    )


@login_required
def workers_page(request):
    workers = Worker.live().select_related("current_run")
    return render(request, "dashboard/workers.html", {"workers": workers})
