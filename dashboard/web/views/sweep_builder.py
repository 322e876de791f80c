"""The sweep builder: a base (a preset or the experiment's config), any number
of rows of field x values, seeds, a queue and a priority. Preview counts and
validates every run; Create queues them (lab.runs.sweeps, the same service as
the API's and ``manage.py submit --sweep``)."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render

from dashboard.web import schema_form
from dashboard.web.views.actions import EXPERIMENT_PAGE, warn_if_unserved
from dashboard.web.views.forms import typed_priority
from lab.configs import resolve_config
from lab.experiments.models import Experiment
from lab.experiments.rights import NotAllowed
from lab.inputs import json_input
from lab.runs import lifecycle, sweeps
from trainer.config.presets import list_presets
from trainer.errors import FieldError

ROW = re.compile(r"(field|values)_([0-9]{1,3})")
BLANK_ROWS_FIRST = 2  # rows an empty builder opens with (the Add a field button adds more)


def grid_rows(data, limit: int) -> list[tuple[str, str]]:
    """The builder's rows (``field_<i>``, ``values_<i>``) in their order, blank rows
    dropped. More rows than the config has fields (``limit``) is no grid."""
    rows: dict[int, dict[str, str]] = {}
    for key in data:
        match = ROW.fullmatch(key)
        if match:
            rows.setdefault(int(match[2]), {})[match[1]] = data.get(key, "")[:10_000]
    if len(rows) > limit:
        raise FieldError([("grid", f"at most {limit} rows: one per config field")])
    ordered = [(r.get("field", ""), r.get("values", "")) for _, r in sorted(rows.items())]
    return [(f, v) for f, v in ordered if f or v.strip()]


def grid_of(rows: list[tuple[str, str]]) -> dict[str, list[Any]]:
    """``{field: values}``; a row without a field, or a field chosen twice, is named."""
    grid: dict[str, list[Any]] = {}
    errors = []
    for field, values in rows:
        if not field:
            errors.append(("grid", f"a row has values ({values[:40]}) but no field: pick one"))
        elif field in grid:
            errors.append((f"grid.{field}", "chosen in two rows: give all its values in one"))
        else:
            grid[field] = parse_values(values)
    if errors:
        raise FieldError(errors)
    return grid


def parse_values(text: str) -> list[Any]:
    """'none, r3' or '[0.1, 0.2]' -> typed list (JSON where an item parses)."""
    text = text.strip()
    if text.startswith("["):
        try:
            values = json_input.loads(text)
            return values if isinstance(values, list) else [values]
        except ValueError:
            pass
    out = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        try:
            out.append(json_input.loads(item))
        except ValueError:  # not JSON (or nested too deep): the text itself
            out.append(item)
    return out


@login_required
def sweep_new(request, pk: int):
    """Preview counts and validates every run of the sweep; Create queues them."""
    experiment = get_object_or_404(Experiment, pk=pk)
    paths = schema_form.field_paths(schema_form.build_sections())
    data = request.POST if request.method == "POST" else request.GET
    priority_text = data.get("priority", "").strip()[:20] or str(lifecycle.DEFAULT_PRIORITY)
    preview = None
    errors: list[str] = []
    rows: list[tuple[str, str]] = []
    try:
        rows = grid_rows(data, limit=len(paths))
        if request.method == "POST":
            priority = typed_priority(priority_text)
            if not isinstance(priority, int):
                raise FieldError([("priority", "priority must be an integer from 0 to 9")])
            grid = grid_of(rows)
            seeds = parse_values(data.get("seeds", "0"))
            base = resolve_config(
                preset=data.get("preset") or None, base=experiment.base_config or None
            ).to_dict()
            planned = sweeps.preview_sweep(base, grid, seeds)
            if data.get("action") == "create":
                sweep = sweeps.create_sweep(
                    owner=request.user,
                    experiment=experiment,
                    base_config=base,
                    grid=grid,
                    seeds=seeds,
                    queue=data.get("queue"),
                    name=data.get("name", ""),
                    priority=priority,
                )
                messages.success(
                    request, f"Sweep queued: {sweep.runs.count()} runs at priority {priority}."
                )
                warn_if_unserved(request, sweep.runs.first().queue)
                return redirect(EXPERIMENT_PAGE, pk)
            preview = {"count": len(planned), "variants": sorted({label for label, _ in planned})}
    except FieldError as exc:
        errors = [f"{p}: {m}" if p else m for p, m in exc.errors]
    except NotAllowed as exc:
        errors = [str(exc)]
    blank = BLANK_ROWS_FIRST if not rows else 1
    return render(
        request,
        "dashboard/sweep_new.html",
        {
            "experiment": experiment,
            "paths": paths,
            "rows": rows + [("", "")] * blank,
            "preview": preview,
            "errors": errors,
            "presets": list_presets(),
            "queues": settings.LAB_QUEUES,
            "data": data,
            "priority": priority_text,
        },
    )
