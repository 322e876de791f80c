"""The runs: the list of all runs (filter, sort, select to compare) and the one
run page, live while it trains."""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from dashboard.charts.panels import chart_id, moe_layers, sections_for
from dashboard.charts.style import metric_title
from dashboard.review import queries as q
from dashboard.review import services
from dashboard.review.external import SYSTEM_PREFIX, external_facts
from dashboard.review.models import VerdictLabel
from dashboard.review.phase import phase_line, progress_bar
from dashboard.review.run_facts import export_command, run_model_facts
from dashboard.web.views.page_common import (
    LIVE_INTERVAL_MS,
    chart_entry,
    page_params,
    page_url,
    x_axis_links,
)
from dashboard.web.views.params import RunPageQuery, RunsListQuery, parse
from lab.experiments import rights
from lab.experiments.models import Experiment
from lab.jobs.queries import placement_text, waiting_reason
from lab.runs.models import Run, RunStatus
from trainer import metric_keys as mk
from trainer.errors import FieldError

RUNS_PER_PAGE = 50


# --------------------------------------------------------------------------- runs list
@page_params
def runs_list(request: HttpRequest) -> HttpResponse:
    """All runs: filter by status, experiment, tag, owner and queue; sort; select to compare."""
    query = parse(RunsListQuery, request)
    filters = query.model_dump(exclude={"page"})
    page = Paginator(q.filtered_runs(**filters), RUNS_PER_PAGE).get_page(query.page)
    runs = list(page.object_list)
    experiments = list(Experiment.objects.order_by("name").values_list("pk", "name", "tags"))
    tags = sorted({t for _, _, ts in experiments for t in (ts or [])})
    owners = list(
        get_user_model()
        .objects.filter(runs__isnull=False)
        .distinct()
        .order_by("username")
        .values_list("username", flat=True)
    )
    verdicts = q.latest_verdicts(r.pk for r in runs)
    pins = set(q.pinned_baselines({r.experiment_id for r in runs}).values())
    query_without_page = request.GET.copy()
    query_without_page.pop("page", None)
    return render(
        request,
        "dashboard/runs_list.html",
        {
            "rows": [
                {"run": r, "verdict": verdicts.get(r.pk), "is_baseline": r.pk in pins} for r in runs
            ],
            "page": page,
            "filters": filters,
            "statuses": RunStatus.values,
            "experiments": [(pk, name) for pk, name, _ in experiments],
            "tags": tags,
            "owners": owners,
            "queues": sorted(set(settings.LAB_QUEUES)),
            "sorts": list(q.SORTS),
            "page_query": query_without_page.urlencode(),
        },
    )


# --------------------------------------------------------------------------- run page
@page_params
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    """One run, live while it trains: the platform's run page (web/run_detail.html:
    status, cancel, clone, config, summary, comments) with the dashboard in its
    run_actions and run_dashboard blocks. Its comment form posts here."""
    run = get_object_or_404(Run.objects.select_related("experiment", "owner", "sweep"), pk=run_id)
    if request.method == "POST":
        try:
            services.comment_on_run(author=request.user, run=run, body=request.POST.get("body", ""))
        except FieldError as exc:
            messages.error(request, "; ".join(m for _, m in exc.errors))
        return redirect(reverse("dashboard:run", args=[run.pk]) + "#comments")
    return render(request, "dashboard/run_detail.html", run_page_context(request, run))


def run_page_context(request: HttpRequest, run: Run) -> dict:
    """Everything dashboard/run_detail.html needs (the platform's keys included), so
    another view can render the same page."""
    pinned = q.pinned_baselines([run.experiment_id]).get(run.experiment_id)
    page_query = parse(RunPageQuery, request)
    chosen, x = page_query.baseline, page_query.x
    x_param = None if x == "step" else x
    baseline_id = pinned if chosen is None else chosen
    baseline = None
    if baseline_id and baseline_id != run.pk:
        baseline = Run.objects.filter(pk=baseline_id).first()
    baseline_param = baseline.pk if baseline else 0
    sections = [
        {
            "title": section.title,
            "charts": [
                chart_entry(
                    chart_id("chart", key),
                    page_url("run_chart", [run.pk], key=key, baseline=baseline_param, x=x_param),
                    metric_title(key),
                )
                for key in section.keys
            ],
        }
        for section in sections_for(run.config)
    ]
    layers = moe_layers(run.config)
    heatmap = (
        chart_entry("chart-expert-load", page_url("run_heatmap", [run.pk], layer=layers[0]))
        if layers
        else None
    )
    return {
        # the platform's run page
        "run": run,
        "can_manage": run.can_manage(request.user),
        "placement": placement_text(run),
        "waiting_reason": waiting_reason(run),
        "phase_text": phase_line(run),
        "bar_value": progress_bar(run)[0],
        "bar_max": progress_bar(run)[1],
        "config_json": json.dumps(run.config, indent=2, sort_keys=True),
        "model_facts": run_model_facts(run.config),
        "export_command": export_command(run),
        "exports": list(run.exports.all()[:10]),
        "can_export": rights.can_queue(request.user, run.experiment),
        "summary_json": json.dumps(run.summary, indent=2, sort_keys=True) if run.summary else "",
        "comments": list(run.comments.select_related("author")),
        # the dashboard
        "label": q.run_label(run),
        "baseline": baseline,
        "baseline_label": q.run_label(baseline) if baseline else "",
        "is_pinned": pinned == run.pk,
        "pinned_id": pinned,
        "sections": sections,
        "heatmap": heatmap,
        "layers": layers,
        "marker": q.collapse_marker(run),
        "log_tail": q.log_tail(run),
        "verdicts": list(run.verdicts.select_related("author")[:20]),
        "verdict_labels": VerdictLabel.choices,
        # pin and verdict forms only for whom the services allow (lab.experiments.rights)
        "can_review": rights.can_give_verdict(request.user, run.experiment),
        "interval_ms": LIVE_INTERVAL_MS,
        "interval_s": LIVE_INTERVAL_MS // 1000,
        "compare_url": page_url("compare", runs=f"{run.pk},{baseline.pk}", baseline=baseline.pk)
        if baseline
        else "",
        "x_axes": x_axis_links(x, lambda mode: page_url("run", [run.pk], baseline=chosen, x=mode)),
        **_external_context(run, x_param),
    }


def _external_context(run: Run, x_param: str | None) -> dict:
    """The run page's parts for a run trained elsewhere (dashboard/review/external.py):
    nested runs, artifacts and logged models, system metrics (drawn on the wall clock
    unless another time axis is chosen), distributions, what an import skipped."""
    facts = external_facts(run)
    if facts is None:
        return {"external": None}
    return {
        "external": facts,
        "system_charts": [
            chart_entry(
                chart_id("system", key),
                page_url("run_chart", [run.pk], key=key, baseline=0, x=x_param or "wall"),
                key.removeprefix(SYSTEM_PREFIX),
            )
            for key in facts.system_keys
        ],
        "distribution_charts": [
            chart_entry(
                chart_id("dist", key),
                page_url("run_distribution", [run.pk], key=key),
                key.removeprefix(mk.DISTRIBUTION_PREFIX),
            )
            for key in facts.distributions
        ],
    }
