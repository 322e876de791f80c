"""Comparing runs: the compare page for any set of runs (one chart per metric,
config diff, expert-load heatmaps side by side), a saved comparison with its
comments, and the list of saved comparisons."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard.charts.configdiff import config_diff, display_value
from dashboard.charts.figures import SHARED_LOAD_SCALE
from dashboard.charts.panels import chart_id, keys_for_runs, moe_layers
from dashboard.charts.style import BASELINE_COLOR, assign_colors, metric_title
from dashboard.review import queries as q
from dashboard.review.models import SavedComparison
from dashboard.review.run_facts import run_model_facts
from dashboard.web.views.page_common import (
    LIVE_INTERVAL_MS,
    chart_entry,
    page_params,
    page_url,
    x_axis_links,
)
from dashboard.web.views.params import ComparePageQuery, parse


def _compare_context(
    ids: list[int], baseline_id: int | None, chosen_layer: int | None, x: str = "step"
) -> dict:
    runs = q.runs_in_order(ids)
    ids = [r.pk for r in runs]
    if baseline_id not in ids:
        baseline_id = None
    labels = {r.pk: q.run_label(r) for r in runs}
    colors = assign_colors(labels.values())
    run_param = ",".join(map(str, ids))
    keys = keys_for_runs([r.config for r in runs]) if runs else []
    x_param = None if x == "step" else x
    charts = [
        chart_entry(
            chart_id("chart", key),
            page_url("compare_chart", runs=run_param, key=key, baseline=baseline_id, x=x_param),
            metric_title(key),
        )
        | {"key": key}
        for key in keys
    ]
    moe_runs = [r for r in runs if moe_layers(r.config)]
    all_layers = sorted({layer for r in moe_runs for layer in moe_layers(r.config)})
    layer = chosen_layer if chosen_layer is not None else (all_layers[0] if all_layers else 0)
    heatmaps = [
        chart_entry(
            f"heatmap-{r.pk}",
            page_url("run_heatmap", [r.pk], layer=layer, scale="shared"),
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
                "pin_url": page_url("compare", runs=run_param, baseline=r.pk, layer=layer),
                "marker": q.collapse_marker(r),
                "facts": run_model_facts(r.config),  # runs of different models line up by step
            }
            for r in runs
        ],
        "run_param": run_param,
        "baseline_id": baseline_id,
        "charts": charts,
        # every metric chart's data in one read and one response (live.js LiveGroup)
        "group_url": page_url("compare_charts", runs=run_param, baseline=baseline_id, x=x_param),
        "x_axes": x_axis_links(
            x,
            lambda mode: page_url(
                "compare", runs=run_param, baseline=baseline_id, layer=chosen_layer, x=mode
            ),
        ),
        "heatmaps": heatmaps,
        "shared_load_scale": SHARED_LOAD_SCALE,
        "layers": all_layers,
        "layer": layer,
        "diff": [
            {"path": path, "values": [display_value(v) for v in values]} for path, values in diff
        ],
        "interval_ms": LIVE_INTERVAL_MS,
        "stability_url": page_url("stability", runs=run_param) if runs else "",
        "unpin_url": page_url("compare", runs=run_param, layer=layer),
    }


@page_params
def compare(request: HttpRequest) -> HttpResponse:
    """Any set of runs: one chart per metric, config diff, heatmaps side by side."""
    query = parse(ComparePageQuery, request)
    context = _compare_context(query.runs, query.baseline, query.layer, query.x)
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
