"""An experiment's runs table (``/experiments/<id>/table``): chosen hyperparameter and
summary-metric columns, sorting, an MLflow search filter, a CSV download, and the
same runs in parallel coordinates (``/experiments/<id>/parallel``, drawn by
live.js from a Plotly ``parcoords`` figure). Rows: dashboard/review/runs_table.py."""

from __future__ import annotations

import csv
import io

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard.charts.export import figure_payload
from dashboard.charts.figures.parallel import parallel_coordinates
from dashboard.review import runs_table as rt
from dashboard.web.views.endpoints import login_required_json
from dashboard.web.views.page_common import page_params, page_url
from dashboard.web.views.params import RunsTableQuery, parse
from lab.experiments.models import Experiment
from lab.tracking.models import TrackedRun

FIXED_COLUMNS = (
    ("run", "run"),
    ("variant", "variant"),
    ("seed", "seed"),
    ("status", "status"),
    ("steps", "steps"),
    ("collapse_step", "collapse step"),
)


def _table(experiment: Experiment, query: RunsTableQuery) -> dict:
    """Rows and columns of the experiment's table as ``query`` asks (the page, the
    CSV and the parallel coordinates share it)."""
    runs = list(experiment.runs.select_related("owner").order_by("pk"))
    tracked = {t.run_id: t for t in TrackedRun.objects.filter(run_id__in=[r.pk for r in runs])}
    all_params = [rt.run_params(r) for r in runs]
    varying = rt.varying_params(all_params)
    available_metrics = rt.available_metrics(runs, tracked)
    params = query.params or varying[: rt.MAX_PARAM_COLUMNS // 2]
    metrics = query.metrics or [m for m in rt.DEFAULT_METRICS if m in available_metrics]
    rows = rt.table_rows(runs, metrics)
    error = ""
    try:
        rows = rt.filter_rows(rows, query.filter)
    except ValueError as exc:
        error = f"filter: {exc}"
    descending = query.order == "desc"
    rows = rt.sort_rows(rows, query.sort, descending)
    columns = list(FIXED_COLUMNS) + [(f"param:{p}", p) for p in params]
    columns += [(f"metric:{m}", m) for m in metrics]
    return {
        "rows": rows,
        "columns": columns,
        "params": params,
        "metrics": metrics,
        "param_choices": sorted({k for p in all_params for k in p}),
        "varying": varying,
        "metric_choices": available_metrics,
        "error": error,
    }


def _csv(table: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([title for _, title in table["columns"]])
    for row in table["rows"]:
        writer.writerow(["" if (v := row.value(c)) is None else v for c, _ in table["columns"]])
    return out.getvalue()


@page_params
def runs_table(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = get_object_or_404(Experiment, pk=experiment_id)
    query = parse(RunsTableQuery, request)
    table = _table(experiment, query)
    if query.format == "csv":
        response = HttpResponse(_csv(table), content_type="text/csv")
        response["Content-Disposition"] = (
            f'attachment; filename="experiment-{experiment.pk}-runs.csv"'
        )
        return response
    base = {
        "params": ",".join(table["params"]),
        "metrics": ",".join(table["metrics"]),
        "filter": query.filter,
    }

    def sort_url(column: str) -> str:
        order = "desc" if column == query.sort and query.order == "asc" else "asc"
        return page_url("runs_table", [experiment.pk], **base, sort=column, order=order)

    color = query.color or (table["metrics"][0] if table["metrics"] else "")
    return render(
        request,
        "dashboard/runs_table.html",
        {
            "experiment": experiment,
            "query": query,
            "headers": [
                {
                    "column": c,
                    "title": t,
                    "url": sort_url(c),
                    "sorted": (query.order if c == query.sort else ""),
                }
                for c, t in table["columns"]
            ],
            "cells": [
                {"row": row, "values": [row.value(c) for c, _ in table["columns"]]}
                for row in table["rows"]
            ],
            **table,
            "color": color,
            "csv_url": page_url(
                "runs_table",
                [experiment.pk],
                **base,
                sort=query.sort,
                order=query.order,
                format="csv",
            ),
            "parallel_url": page_url("runs_parallel", [experiment.pk], **base, color=color),
            "compare_url": page_url("compare", runs=",".join(str(r.run.pk) for r in table["rows"]))
            if table["rows"]
            else "",
        },
    )


@login_required_json
def runs_parallel(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The table's rows in parallel coordinates: its hyperparameter and metric columns
    as axes, lines coloured by ``color`` (a metric column)."""
    experiment = get_object_or_404(Experiment, pk=experiment_id)
    query = parse(RunsTableQuery, request)
    table = _table(experiment, query)
    rows = table["rows"]
    axes = [(p, [r.params.get(p) for r in rows]) for p in table["params"]]
    axes += [(m, [r.metrics.get(m) for r in rows]) for m in table["metrics"]]
    color = query.color if query.color in table["metrics"] else None
    fig = parallel_coordinates(
        axes, (color, [r.metrics.get(color) for r in rows]) if color else None
    )
    response = HttpResponse(
        figure_payload(fig, running=any(r.run.is_active for r in rows)),
        content_type="application/json",
    )
    response["Cache-Control"] = "no-store"
    return response
