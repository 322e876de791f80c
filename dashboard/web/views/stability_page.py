"""The stability review page: the seeds' table per variant from the chosen runs,
the collapse strip, survival (and dose / routing-gap) charts, the causal panel,
and the table's downloads."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.charts import causal
from dashboard.charts.stability import STABILITY_COLUMNS, stability_table_rows
from dashboard.charts.stability_stats import dose_layout, reference_of, survival_rows
from dashboard.review import queries as q
from dashboard.review.seeds import seed_rule, split_seeds
from dashboard.web.views.endpoints import stability_runs
from dashboard.web.views.page_common import LIVE_INTERVAL_MS, chart_entry, page_params, page_url
from dashboard.web.views.params import RunSelectionQuery, parse
from lab.experiments.models import Experiment, Sweep


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
    records = q.run_records(runs)
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
            "switch_url": page_url("stability", **switched),
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
            "survival_csv": page_url("stability_table", format="csv", table="survival", **scope),
            "charts": [
                chart_entry("chart-collapse", page_url("stability_chart", ["collapse"], **scope)),
                chart_entry("chart-survival", page_url("stability_chart", ["survival"], **scope)),
                *(
                    [chart_entry("chart-dose", page_url("stability_chart", ["dose"], **scope))]
                    if dose_layout([row.variant for row in rows])
                    else []
                ),
                *(
                    [chart_entry("chart-gap", page_url("stability_chart", ["gap"], **scope))]
                    if causal_panel
                    else []
                ),
            ],
            "causal": causal_panel,
            "table_csv": page_url("stability_table", format="csv", **scope),
            "table_json": page_url("stability_table", format="json", **scope),
            "interval_ms": LIVE_INTERVAL_MS,
        },
    )
