"""Dashboard pages. Each renders completely on the server (tables, config, comments,
verdicts); the charts fill themselves from the JSON endpoints (endpoints.py)
through static/dashboard/live.js. Query counts do not grow with the number of
runs shown (tests/dashboard/test_dashboard_queries.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import wraps
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.html import escape

from dashboard import causal, services
from dashboard import queries as q
from dashboard.configdiff import config_diff, display_value
from dashboard.figures import SHARED_LOAD_SCALE
from dashboard.models import BaselinePin, SavedComparison, VerdictLabel
from dashboard.panels import (
    chart_id,
    experiment_keys,
    is_moe,
    keys_for_runs,
    moe_layers,
    sections_for,
)
from dashboard.phase import phase_line, progress_bar
from dashboard.run_facts import export_command, run_model_facts
from dashboard.seeds import STOPPED_STATUSES, seed_rule, split_seeds
from dashboard.stability import STABILITY_COLUMNS, stability_table_rows
from dashboard.stability_stats import dose_layout, reference_of, survival_rows
from dashboard.style import BASELINE_COLOR, assign_colors, metric_title, variant_colors
from dashboard.views.endpoints import stability_runs
from dashboard.views.params import (
    ComparePageQuery,
    RunPageQuery,
    RunSelectionQuery,
    RunsListQuery,
    VariantPageQuery,
    parse,
)
from lab.experiments import rights
from lab.experiments.models import Experiment, Sweep
from lab.jobs.queries import placement_text, waiting_reason
from lab.runs.models import Run, RunStatus
from trainer.errors import FieldError

RUNS_PER_PAGE = 50
LIVE_INTERVAL_MS = 5000


def page_params(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Login required, and a malformed query parameter answers 400 naming it."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except FieldError as exc:
            return HttpResponseBadRequest(escape(str(exc)))

    return wrapper


def _url(name: str, args: Sequence = (), **query) -> str:
    base = reverse(f"dashboard:{name}", args=list(args))
    query = {k: v for k, v in query.items() if v is not None and v != ""}
    return f"{base}?{urlencode(query)}" if query else base


def _chart(chart_id_: str, url: str, title: str = "") -> dict[str, str]:
    return {"chart_id": chart_id_, "url": url, "title": title}


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
    chosen = parse(RunPageQuery, request).baseline
    baseline_id = pinned if chosen is None else chosen
    baseline = None
    if baseline_id and baseline_id != run.pk:
        baseline = Run.objects.filter(pk=baseline_id).first()
    baseline_param = baseline.pk if baseline else 0
    sections = [
        {
            "title": section.title,
            "charts": [
                _chart(
                    chart_id("chart", key),
                    _url("run_chart", [run.pk], key=key, baseline=baseline_param),
                    metric_title(key),
                )
                for key in section.keys
            ],
        }
        for section in sections_for(run.config)
    ]
    layers = moe_layers(run.config)
    heatmap = (
        _chart("chart-expert-load", _url("run_heatmap", [run.pk], layer=layers[0]))
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
        "compare_url": _url("compare", runs=f"{run.pk},{baseline.pk}", baseline=baseline.pk)
        if baseline
        else "",
    }


# --------------------------------------------------------------------------- experiment / sweep
def _verdict_rows(runs: Sequence[Run]) -> list[dict]:
    verdicts = q.latest_verdicts(r.pk for r in runs)
    return [
        {
            "run": r,
            "variant": q.variant_of(r),
            "verdict": verdicts.get(r.pk),
            "label": q.run_label(r),
        }
        for r in runs
    ]


def _variant_page(
    request: HttpRequest,
    *,
    experiment: Experiment,
    sweep: Sweep | None,
    runs: list[Run],
    chart_name: str,
    chart_arg: int,
    scope: dict[str, int],
) -> HttpResponse:
    band = parse(VariantPageQuery, request).band
    moe = any(is_moe(r.config) for r in runs)
    keys = experiment_keys(moe)
    charts = [
        _chart(
            chart_id("chart", key),
            _url(chart_name, [chart_arg], key=key, band=band),
            metric_title(key),
        )
        for key in keys
    ]
    variants: dict[str, list[Run]] = {}
    for run in runs:
        variants.setdefault(q.variant_of(run), []).append(run)
    colors = variant_colors(variants)
    pin = BaselinePin.objects.filter(experiment=experiment).select_related("run").first()
    ids = ",".join(str(r.pk) for r in runs)
    return render(
        request,
        "dashboard/variants.html",
        {
            "experiment": experiment,
            "sweep": sweep,
            "sweeps": list(experiment.sweeps.all()) if sweep is None else [],
            "rows": _verdict_rows(runs),
            # seeds: the runs that count as seeds of their variant (dashboard/seeds.py),
            # as on the stability review; cancelled and failed runs are counted apart
            "variants": [
                {
                    "name": v,
                    "color": colors[v],
                    "seeds": sum(r.status not in STOPPED_STATUSES for r in rs),
                    "stopped": sum(r.status in STOPPED_STATUSES for r in rs),
                    "active": sum(r.is_active for r in rs),
                }
                for v, rs in variants.items()
            ],
            "seed_rule": seed_rule(False),
            "grid_rows": sorted((field, values) for field, values in (sweep.grid or {}).items())
            if sweep
            else [],
            "progress": _sweep_progress(runs) if sweep else None,
            "charts": charts,
            "band": band,
            "pin": pin,
            "interval_ms": LIVE_INTERVAL_MS,
            "stability_url": _url("stability", **scope),
            "compare_url": _url("compare", runs=ids) if runs else "",
            "grid_json": json.dumps(sweep.grid, indent=2, sort_keys=True) if sweep else "",
            # an experiment's comments (a sweep page has none of its own)
            "comments": list(experiment.comments.select_related("author")) if not sweep else [],
            "comment_action": reverse("dashboard:experiment", args=[experiment.pk])
            if not sweep
            else "",
        },
    )


def _sweep_progress(runs: list[Run]) -> dict[str, int]:
    """How far a sweep is: its runs finished, training or waiting, and stopped."""
    stopped = sum(r.status in STOPPED_STATUSES for r in runs)
    active = sum(r.is_active for r in runs)
    return {"total": len(runs), "active": active, "stopped": stopped,
            "finished": len(runs) - active - stopped}  # fmt: skip


@page_params
def experiment_detail(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The one experiment page: its variants aggregated across seeds, its runs and
    sweeps, new run / sweep builder actions and comments (the form posts here)."""
    experiment = get_object_or_404(Experiment.objects.select_related("owner"), pk=experiment_id)
    if request.method == "POST":
        try:
            services.comment_on_experiment(
                author=request.user, experiment=experiment, body=request.POST.get("body", "")
            )
        except FieldError as exc:
            messages.error(request, "; ".join(m for _, m in exc.errors))
        return redirect(reverse("dashboard:experiment", args=[experiment.pk]) + "#comments")
    runs = list(experiment.runs.select_related("owner").order_by("pk"))
    return _variant_page(
        request,
        experiment=experiment,
        sweep=None,
        runs=runs,
        chart_name="experiment_chart",
        chart_arg=experiment.pk,
        scope={"experiment": experiment.pk},
    )


@page_params
def sweep_detail(request: HttpRequest, sweep_id: int) -> HttpResponse:
    """A sweep's grid points (variants) aggregated across its seeds."""
    sweep = get_object_or_404(Sweep.objects.select_related("experiment", "owner"), pk=sweep_id)
    runs = list(sweep.runs.select_related("owner").order_by("pk"))
    return _variant_page(
        request,
        experiment=sweep.experiment,
        sweep=sweep,
        runs=runs,
        chart_name="sweep_chart",
        chart_arg=sweep.pk,
        scope={"sweep": sweep.pk},
    )


# --------------------------------------------------------------------------- compare
def _compare_context(ids: list[int], baseline_id: int | None, chosen_layer: int | None) -> dict:
    runs = q.runs_in_order(ids)
    ids = [r.pk for r in runs]
    if baseline_id not in ids:
        baseline_id = None
    labels = {r.pk: q.run_label(r) for r in runs}
    colors = assign_colors(labels.values())
    run_param = ",".join(map(str, ids))
    keys = keys_for_runs([r.config for r in runs]) if runs else []
    charts = [
        _chart(
            chart_id("chart", key),
            _url("compare_chart", runs=run_param, key=key, baseline=baseline_id),
            metric_title(key),
        )
        | {"key": key}
        for key in keys
    ]
    moe_runs = [r for r in runs if moe_layers(r.config)]
    all_layers = sorted({layer for r in moe_runs for layer in moe_layers(r.config)})
    layer = chosen_layer if chosen_layer is not None else (all_layers[0] if all_layers else 0)
    heatmaps = [
        _chart(
            f"heatmap-{r.pk}",
            _url("run_heatmap", [r.pk], layer=layer, scale="shared"),
            labels[r.pk],
        )
        for r in moe_runs
        if layer in moe_layers(r.config)
    ]
    diff = config_diff([r.config for r in runs]) if len(runs) > 1 else []
    verdicts = q.latest_verdicts(ids)
    return {
        "runs": [
            {
                "run": r,
                "label": labels[r.pk],
                "color": BASELINE_COLOR if r.pk == baseline_id else colors[labels[r.pk]],
                "verdict": verdicts.get(r.pk),
                "is_baseline": r.pk == baseline_id,
                "pin_url": _url("compare", runs=run_param, baseline=r.pk, layer=layer),
                "marker": q.collapse_marker(r),
                "facts": run_model_facts(r.config),  # runs of different models line up by step
            }
            for r in runs
        ],
        "run_param": run_param,
        "baseline_id": baseline_id,
        "charts": charts,
        # every metric chart's data in one read and one response (live.js LiveGroup)
        "group_url": _url("compare_charts", runs=run_param, baseline=baseline_id),
        "heatmaps": heatmaps,
        "shared_load_scale": SHARED_LOAD_SCALE,
        "layers": all_layers,
        "layer": layer,
        "diff": [
            {"path": path, "values": [display_value(v) for v in values]} for path, values in diff
        ],
        "interval_ms": LIVE_INTERVAL_MS,
        "stability_url": _url("stability", runs=run_param) if runs else "",
        "unpin_url": _url("compare", runs=run_param, layer=layer),
    }


@page_params
def compare(request: HttpRequest) -> HttpResponse:
    """Any set of runs: one chart per metric, config diff, heatmaps side by side."""
    query = parse(ComparePageQuery, request)
    context = _compare_context(query.runs, query.baseline, query.layer)
    return render(request, "dashboard/compare.html", context | {"comparison": None})


@page_params
def comparison_detail(request: HttpRequest, comparison_id: int) -> HttpResponse:
    """A saved comparison: its runs and baseline, and the team's comments on it."""
    comparison = get_object_or_404(
        SavedComparison.objects.select_related("owner"), pk=comparison_id
    )
    context = _compare_context(
        [int(i) for i in comparison.run_ids],
        comparison.baseline_id,
        parse(ComparePageQuery, request).layer,
    )
    return render(
        request,
        "dashboard/compare.html",
        context
        | {
            "comparison": comparison,
            "can_delete": comparison.can_manage(request.user),
            "comments": list(comparison.comments.select_related("author")),
        },
    )


@page_params
def comparisons_list(request: HttpRequest) -> HttpResponse:
    comparisons = SavedComparison.objects.select_related("owner", "baseline")[:200]
    return render(request, "dashboard/comparisons.html", {"comparisons": comparisons})


# --------------------------------------------------------------------------- stability review
@page_params
def stability(request: HttpRequest) -> HttpResponse:
    """The seeds' table per variant from the chosen runs, collapse strip, survival curves."""
    selection = parse(RunSelectionQuery, request)
    chosen = stability_runs(selection)
    runs, left_out = split_seeds(chosen, include_stopped=selection.stopped)
    scope = selection.scope()  # every chosen run, for the charts and the downloads
    if not chosen:
        return render(
            request,
            "dashboard/stability.html",
            {
                "runs": [],
                "experiments": Experiment.objects.order_by("-created_at")[:100],
                "sweeps": Sweep.objects.select_related("experiment").order_by("-created_at")[:100],
            },
        )
    inputs = q.stability_stats(runs)
    rows = stability_table_rows(inputs.stats)
    records = q.causal_records(runs)
    causal_panel = causal.effects(records) if causal.applies(records) else None
    verdicts = q.latest_verdicts(r.pk for r in chosen)
    outcome_by_label = {s.outcome.label: s for s in inputs.stats}
    left_out_ids = {r.pk for r in left_out}
    switched = {k: v for k, v in scope.items() if k != "stopped"}
    if not selection.stopped:
        switched["stopped"] = 1
    return render(
        request,
        "dashboard/stability.html",
        {
            "runs": chosen,
            "seed_count": len(runs),
            "left_out": left_out,
            "include_stopped": selection.stopped,
            "seed_rule": seed_rule(selection.stopped),
            "switch_url": _url("stability", **switched),
            "columns": STABILITY_COLUMNS,
            "table": [[row.cells()[field] for field, _ in STABILITY_COLUMNS] for row in rows],
            "per_run": [
                {
                    "run": r,
                    "label": q.run_label(r),
                    "variant": q.variant_of(r),
                    "stats": outcome_by_label.get(q.run_label(r)),
                    "verdict": verdicts.get(r.pk),
                    "not_a_seed": r.pk in left_out_ids,
                }
                for r in chosen
            ],
            "skipped": inputs.skipped,
            "survival": survival_rows(rows, selection.reference),
            "reference": reference_of(rows, selection.reference),
            "variant_names": sorted(row.variant for row in rows),
            "scope_fields": [(k, v) for k, v in scope.items() if k != "reference"],
            "survival_csv": _url("stability_table", format="csv", table="survival", **scope),
            "charts": [
                _chart("chart-collapse", _url("stability_chart", ["collapse"], **scope)),
                _chart("chart-survival", _url("stability_chart", ["survival"], **scope)),
                *(
                    [_chart("chart-dose", _url("stability_chart", ["dose"], **scope))]
                    if dose_layout([row.variant for row in rows])
                    else []
                ),
                *(
                    [_chart("chart-gap", _url("stability_chart", ["gap"], **scope))]
                    if causal_panel
                    else []
                ),
            ],
            "causal": causal_panel,
            "table_csv": _url("stability_table", format="csv", **scope),
            "table_json": _url("stability_table", format="json", **scope),
            "interval_ms": LIVE_INTERVAL_MS,
        },
    )
