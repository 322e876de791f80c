"""JSON chart endpoints read by static/dashboard/live.js, and their downloads.

Every endpoint answers ``?max_points=&start=&end=`` with the live payload
(``{"figure", "running"}``, series downsampled keeping extremes, a zoomed
window at full resolution when it fits) and ``?format=csv|json`` with the
chart's data as a file (full resolution unless max_points is given). A metric
read is two queries per run set (runs.metrics.read.metric_series_many).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import wraps

import plotly.graph_objects as go
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404

from dashboard.charts import causal
from dashboard.charts.build import layer_heatmap, run_lines, variant_bands
from dashboard.charts.export import (
    EXPORT_FORMATS,
    encode_payload,
    export_body,
    figure_dict,
    figure_payload,
    records_to_csv,
)
from dashboard.charts.figures import collapse_strip, survival_curves
from dashboard.charts.figures.collapse import dose_response
from dashboard.charts.stability import stability_table_rows
from dashboard.charts.stability_stats import dose_layout, survival_rows
from dashboard.charts.style import assign_colors, variant_colors
from dashboard.charts.time_axis import TimeAxis
from dashboard.review import queries as q
from dashboard.review.clocks import step_clocks
from dashboard.review.emptiness import empty_reason
from dashboard.review.phase import phase_line, progress_bar
from dashboard.review.seeds import split_seeds
from dashboard.web.views.params import (
    ChartQuery,
    CompareChartQuery,
    CompareChartsQuery,
    HeatmapQuery,
    RunChartQuery,
    RunSelectionQuery,
    VariantChartQuery,
    parse,
)
from lab.experiments.models import Experiment, Sweep
from lab.jobs.queries import placement_text, waiting_reason
from lab.runs.models import Run
from trainer import metric_keys as mk
from trainer.errors import FieldError

STABILITY_CHARTS = ("collapse", "survival", "dose", "gap")


def login_required_json(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """401 JSON instead of a redirect to the login page (a fetch cannot follow that
    usefully), and 400 JSON naming the bad parameter (``{"errors": {name: [...]}}``)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_authenticated:
            return JsonResponse({"detail": "log in to see this chart"}, status=401)
        try:
            return view(request, *args, **kwargs)
        except FieldError as exc:
            return JsonResponse({"errors": exc.as_dict()}, status=400)

    return wrapper


def chart_response(
    query: ChartQuery | RunSelectionQuery, fig: go.Figure, *, running: bool, filename: str
) -> HttpResponse:
    """The live payload, or the chart's data as a download when ``?format=`` is given."""
    fmt = query.format
    if fmt is None:
        response = HttpResponse(
            figure_payload(fig, running=running), content_type="application/json"
        )
    else:
        body, content_type = export_body(fig, fmt)
        response = HttpResponse(body, content_type=content_type)
        response["Content-Disposition"] = f'attachment; filename="{filename}.{fmt}"'
    response["Cache-Control"] = "no-store"
    return response


def _slug(key: str) -> str:
    return key.replace("/", "_")


def _time_axis(mode: str, runs: Sequence[Run], key: str, labels: dict[int, str]) -> TimeAxis:
    """The x axis of a line chart: steps, or each run's steps at their times."""
    if mode == "step":
        return TimeAxis()
    clocks = step_clocks(runs, key)
    return TimeAxis(mode, {labels[r.pk]: clocks[r.pk] for r in runs if r.pk in clocks})


def _baseline_for(chosen: int | None, run: Run) -> Run | None:
    """``?baseline=<id>`` (0: none), else the run's experiment's pinned baseline."""
    if chosen is None:
        chosen = q.pinned_baselines([run.experiment_id]).get(run.experiment_id)
    if not chosen or chosen == run.pk:
        return None
    return Run.objects.filter(pk=chosen).first()


# --------------------------------------------------------------------------- one run
@login_required_json
def run_chart(request: HttpRequest, run_id: int) -> HttpResponse:
    """One metric of a run, drawn against its baseline when one is pinned or chosen."""
    run = get_object_or_404(Run, pk=run_id)
    query = parse(RunChartQuery, request)
    key, window = query.key, query.window
    fetch = window.fetch_bounds()
    baseline = _baseline_for(query.baseline, run)
    runs = [run] + ([baseline] if baseline else [])
    data = q.series_for(runs, [key], start=fetch[0], end=fetch[1])
    labels = {r.pk: q.run_label(r) for r in runs}
    markers = {labels[r.pk]: m for r in runs if (m := q.collapse_marker(r))}
    fig = run_lines(
        {labels[r.pk]: q.series_of(data[r.pk], key) for r in runs},
        key,
        window,
        baseline=labels[baseline.pk] if baseline else None,
        collapse_markers=markers,
        colors=assign_colors([labels[run.pk]]),
        empty_message=empty_reason(run, key),
        time_axis=_time_axis(query.x, runs, key, labels),
    )
    return chart_response(query, fig, running=run.is_active, filename=f"run-{run.pk}-{_slug(key)}")


@login_required_json
def run_heatmap(request: HttpRequest, run_id: int) -> HttpResponse:
    """Expert load of one MoE layer of a run (experts x steps); ``?layer=`` and
    ``?scale=auto|shared`` (shared: the compare page's common color scale)."""
    run = get_object_or_404(Run, pk=run_id)
    query = parse(HeatmapQuery, request)
    layer, shared_scale, window = query.layer, query.scale == "shared", query.window
    fetch = window.fetch_bounds()
    key = mk.experts_load(layer)
    steps, vectors = q.series_of(
        q.series_for([run], [key], start=fetch[0], end=fetch[1])[run.pk], key
    )
    fig = layer_heatmap(
        steps,
        vectors,
        layer,
        window,
        title=f"{q.run_label(run)}: expert load, layer {layer}",
        shared_scale=shared_scale,
    )
    return chart_response(
        query, fig, running=run.is_active, filename=f"run-{run.pk}-expert-load-L{layer}"
    )


@login_required_json
def run_status(request: HttpRequest, run_id: int) -> JsonResponse:
    """Status, progress and the log tail, polled by the run page while the run is active."""
    run = get_object_or_404(Run, pk=run_id)
    summary = run.summary or {}
    response = JsonResponse(
        {
            "id": run.pk,
            "status": run.status,
            "running": run.is_active,
            "current_step": run.current_step,
            "total_steps": run.total_steps,
            "progress": run.progress,
            # the bar follows the warm start's SFT steps until RL step 0 (dashboard/review/phase.py)
            "bar": dict(zip(("value", "max"), progress_bar(run), strict=True)),
            "placement": placement_text(run),
            "waiting_reason": waiting_reason(run),
            "phase": run.phase,
            "phase_text": phase_line(run),
            "collapsed": summary.get("collapsed"),
            "collapse_step": summary.get("collapse_step"),
            "collapse_reason": summary.get("collapse_reason"),
            "error": run.error,
            # a run that failed on its config: the page reloads to offer "Clone and fix"
            "failed_on_config": run.failed_on_config,
            "log_tail": q.log_tail(run),
        }
    )
    response["Cache-Control"] = "no-store"
    return response


# --------------------------------------------------------------------------- run sets
@login_required_json
def compare_chart(request: HttpRequest) -> HttpResponse:
    """One metric of every compared run overlaid, the baseline drawn distinctly."""
    query = parse(CompareChartQuery, request)
    runs = q.runs_in_order(query.runs)
    key, window, baseline_id = query.key, query.window, query.baseline
    fetch = window.fetch_bounds()
    labels = {r.pk: q.run_label(r) for r in runs}
    data = q.series_for(runs, [key], start=fetch[0], end=fetch[1])
    fig = run_lines(
        {labels[r.pk]: q.series_of(data[r.pk], key) for r in runs},
        key,
        window,
        baseline=labels.get(baseline_id) if baseline_id else None,
        collapse_markers={labels[r.pk]: m for r in runs if (m := q.collapse_marker(r))},
        colors=assign_colors(labels.values()),
        time_axis=_time_axis(query.x, runs, key, labels),
    )
    return chart_response(
        query, fig, running=any(r.is_active for r in runs), filename=f"compare-{_slug(key)}"
    )


@login_required_json
def compare_charts(request: HttpRequest) -> HttpResponse:
    """Several metrics of the compared runs in ONE response and ONE metric read:
    ``{"charts": {key: {"figure", "running"}}, "running": bool}``.

    The compare page's chart group (live.js ``LiveGroup``) asks for its first
    chart alone and for the rest in one request, then polls them together;
    a zoomed chart fetches its own window from ``compare_chart``.
    """
    query = parse(CompareChartsQuery, request)  # refuses a zoom window
    runs = q.runs_in_order(query.runs)
    keys, window, baseline_id = query.keys, query.window, query.baseline
    labels = {r.pk: q.run_label(r) for r in runs}
    colors = assign_colors(labels.values())
    markers = {labels[r.pk]: m for r in runs if (m := q.collapse_marker(r))}
    running = any(r.is_active for r in runs)
    data = q.series_for(runs, keys)
    charts = {
        key: figure_dict(
            run_lines(
                {labels[r.pk]: q.series_of(data[r.pk], key) for r in runs},
                key,
                window,
                baseline=labels.get(baseline_id) if baseline_id else None,
                collapse_markers=markers,
                colors=colors,
                time_axis=_time_axis(query.x, runs, key, labels),
            ),
            running=running,
        )
        for key in keys
    }
    response = HttpResponse(
        encode_payload({"charts": charts, "running": running}), content_type="application/json"
    )
    response["Cache-Control"] = "no-store"
    return response


def _variant_chart(request: HttpRequest, runs: Sequence[Run], filename: str) -> HttpResponse:
    query = parse(VariantChartQuery, request)
    key, band, window = query.key, query.band, query.window
    fetch = window.fetch_bounds()
    data = q.series_for(runs, [key], start=fetch[0], end=fetch[1])
    seeds: dict[str, list] = {}
    for run in runs:
        seeds.setdefault(q.variant_of(run), []).append(q.series_of(data[run.pk], key))
    fig = variant_bands(seeds, key, window, band=band, colors=variant_colors(seeds))
    return chart_response(
        query,
        fig,
        running=any(r.is_active for r in runs),
        filename=f"{filename}-{_slug(key)}",
    )


@login_required_json
def experiment_chart(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """Variants of an experiment aggregated over seeds: mean, band, thin seed lines."""
    experiment = get_object_or_404(Experiment, pk=experiment_id)
    runs = list(experiment.runs.order_by("pk"))
    return _variant_chart(request, runs, f"experiment-{experiment.pk}")


@login_required_json
def sweep_chart(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = get_object_or_404(Sweep, pk=sweep_id)
    runs = list(sweep.runs.order_by("pk"))
    return _variant_chart(request, runs, f"sweep-{sweep.pk}")


def stability_runs(selection: RunSelectionQuery) -> list[Run]:
    """The runs a stability review is about: every id of ``?runs=`` (repeated or comma
    separated), or all of ``?experiment=`` or ``?sweep=``."""
    if selection.runs:
        return q.runs_in_order(selection.runs)
    if selection.experiment is not None:
        return list(Run.objects.filter(experiment_id=selection.experiment).order_by("pk"))
    if selection.sweep is not None:
        return list(Run.objects.filter(sweep_id=selection.sweep).order_by("pk"))
    return []


def stability_seeds(selection: RunSelectionQuery) -> tuple[list[Run], list[Run]]:
    """The chosen runs that count as seeds, and the stopped ones left out
    (dashboard/review/seeds.py: cancelled and failed runs only with ``?stopped=1``)."""
    return split_seeds(stability_runs(selection), include_stopped=selection.stopped)


@login_required_json
def stability_chart(request: HttpRequest, chart: str) -> HttpResponse:
    """Collapse step per seed (strip), Kaplan-Meier survival per variant, the
    precision dose-response, or time to collapse against the routing gap."""
    if chart not in STABILITY_CHARTS:
        raise FieldError([("chart", f"chart must be one of: {', '.join(STABILITY_CHARTS)}")])
    selection = parse(RunSelectionQuery, request)
    runs, _ = stability_seeds(selection)
    outcomes: dict[str, list] = {}
    for outcome in q.outcomes_for(runs):
        outcomes.setdefault(outcome.variant, []).append(outcome)
    if chart == "gap":
        records = q.run_records(runs)
        if not causal.applies(records):
            raise FieldError([("chart", "these MoE runs do not span a routing gap")])
        fig = causal.gap_scatter(records, colors=variant_colors(sorted(outcomes)))
        return chart_response(
            selection, fig, running=any(r.is_active for r in runs), filename="stability-gap"
        )
    if chart == "dose":
        layout = dose_layout(list(outcomes))
        if layout is None:
            raise FieldError([("chart", "these runs have no rollout-precision dose axis")])
        fig = dose_response(outcomes, layout, colors=variant_colors(layout["arms"]))
    else:
        colors = variant_colors(outcomes)
        builder = collapse_strip if chart == "collapse" else survival_curves
        fig = builder(outcomes, colors=colors)
    return chart_response(
        selection, fig, running=any(r.is_active for r in runs), filename=f"stability-{chart}"
    )


@login_required_json
def stability_table(request: HttpRequest) -> HttpResponse:
    """The stability table as JSON (default) or CSV (``?format=csv``; with
    ``?table=survival`` the time-to-collapse table). ``?reference=`` picks the
    log-rank baseline."""
    selection = parse(RunSelectionQuery, request)
    runs, _ = stability_seeds(selection)
    rows = stability_table_rows(q.stability_stats(runs).stats)
    survival = [row.as_dict() for row in survival_rows(rows, selection.reference)]
    fmt = selection.format or "json"
    name = "time-to-collapse" if selection.table == "survival" else "stability-table"
    if fmt == "json":
        response = JsonResponse({"rows": [row.as_dict() for row in rows], "survival": survival})
    else:  # ?table=survival: the time-to-collapse table (median, log-rank p, KL interval)
        table = survival if selection.table == "survival" else [row.as_dict() for row in rows]
        response = HttpResponse(records_to_csv(table), content_type=EXPORT_FORMATS["csv"])
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response
