"""The experiment and sweep pages: their variants aggregated across seeds
(dashboard/variants.html), their runs with verdicts, a sweep's grid and progress,
an experiment's sweeps and comments."""

from __future__ import annotations

import json
from collections.abc import Sequence

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from dashboard.charts.panels import chart_id, experiment_keys, is_moe
from dashboard.charts.style import metric_title, variant_colors
from dashboard.review import queries as q
from dashboard.review import services
from dashboard.review.models import BaselinePin
from dashboard.review.seeds import STOPPED_STATUSES, seed_rule
from dashboard.web.views.page_common import LIVE_INTERVAL_MS, chart_entry, page_params, page_url
from dashboard.web.views.params import VariantPageQuery, parse
from lab.experiments.models import Experiment, Sweep
from lab.runs.models import Run
from trainer.errors import FieldError


def _verdict_rows(runs: Sequence[Run]) -> list[dict]:
    verdicts = q.latest_verdicts(r.pk for r in runs)
    parents = q.parents_of([r.pk for r in runs if r.is_external])
    return [
        {
            "run": r,
            "variant": q.variant_of(r),
            "verdict": verdicts.get(r.pk),
            "label": q.run_label(r),
            "parent_id": parents.get(r.pk),
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
    deleted_runs: list[dict] | None = None,
) -> HttpResponse:
    """``deleted_runs``: the experiment page's soft-deleted runs, each with whether the
    viewer may restore it (a sweep page lists none)."""
    band = parse(VariantPageQuery, request).band
    moe = any(is_moe(r.config) for r in runs)
    keys = experiment_keys(moe)
    charts = [
        chart_entry(
            chart_id("chart", key),
            page_url(chart_name, [chart_arg], key=key, band=band),
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
            "deleted_runs": deleted_runs or [],
            "rows": _verdict_rows(runs),
            # seeds: the runs that count as seeds of their variant (dashboard/review/seeds.py),
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
            "stability_url": page_url("stability", **scope),
            "compare_url": page_url("compare", runs=ids) if runs else "",
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
    paused = sum(r.waits_paused for r in runs)
    return {
        "total": len(runs),
        "active": active,
        "stopped": stopped,
        "paused": paused,
        "finished": len(runs) - active - stopped,
    }


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
    deleted = Run.all_objects.filter(experiment=experiment, deleted_at__isnull=False)
    return _variant_page(
        request,
        experiment=experiment,
        sweep=None,
        runs=runs,
        chart_name="experiment_chart",
        chart_arg=experiment.pk,
        scope={"experiment": experiment.pk},
        deleted_runs=[
            {"run": run, "can_restore": run.can_manage(request.user)}
            for run in deleted.select_related("owner").order_by("-deleted_at", "-pk")
        ],
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
