"""Reads shared by the API and the pages: metric series, queue position, ETA."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.db.models import F, FloatField, Max, Q
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, Mod
from django.utils import timezone

from runs.models import MetricStep, Run, RunStatus
from trainer.metric_keys import is_vector_key


def metric_series(
    run_id: int,
    keys: list[str],
    *,
    start: int | None = None,
    end: int | None = None,
    max_points: int = 1000,
    last_step: int | None = None,
) -> dict[str, Any]:
    """``{"steps": [...], "series": {key: [...]}}`` for steps in [start, end], in ONE query.

    Only the requested keys leave the database (JSON key extraction in SQL).
    Longer ranges are thinned to ``max_points`` by an even stride that always
    keeps the last step (a live run's newest point). With ``last_step`` known
    (the run's progress), the stride is applied in SQL, so a 100k-step run
    sends only ``max_points`` rows.
    """
    rows = MetricStep.objects.filter(run_id=run_id)
    lo = start or 0
    if start is not None:
        rows = rows.filter(step__gte=start)
    if end is not None:
        rows = rows.filter(step__lte=end)
    if last_step is not None:
        hi = min(end, last_step) if end is not None else last_step
        span = hi - lo + 1
        if span > max_points:
            # One slot is reserved for the last step, which is always kept.
            stride = math.ceil(span / max(1, max_points - 1))
            rows = rows.annotate(_phase=Mod(F("step") - lo, stride)).filter(
                Q(_phase=0) | Q(step__gte=hi)
            )
    aliases = {f"k{i}": key for i, key in enumerate(keys)}
    rows = rows.annotate(**{a: _extract(k) for a, k in aliases.items()})
    data = list(rows.order_by("step").values_list("step", *aliases))
    if len(data) > max_points:
        stride = math.ceil(len(data) / max_points)
        thinned = data[::stride]
        if thinned[-1] is not data[-1]:
            if len(thinned) == max_points:
                thinned[-1] = data[-1]
            else:
                thinned.append(data[-1])
        data = thinned
    return {
        "steps": [row[0] for row in data],
        "series": {key: [row[i + 1] for row in data] for i, key in enumerate(keys)},
    }


def _extract(key: str):
    """SQL for one key: scalars as floats (cast in the database, no JSON decoding
    per row in Python), per-layer load vectors as JSON."""
    if is_vector_key(key):
        return KeyTransform(key, "values")
    return Cast(KeyTextTransform(key, "values"), FloatField())


def metric_keys(run_id: int) -> list[str]:
    """Keys present in the run's latest stored step."""
    row = MetricStep.objects.filter(run_id=run_id).order_by("-step").values("values").first()
    return sorted(row["values"]) if row else []


def queue_position(run: Run) -> int | None:
    """1-based place among the queued runs of the same queue (priority, then age)."""
    if run.status != RunStatus.QUEUED:
        return None
    ahead = Run.objects.filter(queue=run.queue, status=RunStatus.QUEUED).filter(
        Q(priority__gt=run.priority) | Q(priority=run.priority, created_at__lt=run.created_at)
    )
    return ahead.count() + 1


def eta_seconds(run: Run) -> float | None:
    """Remaining time from this attempt's pace so far (None until a step is stored)."""
    if run.status != RunStatus.RUNNING or not run.started_at or run.current_step <= 0:
        return None
    # Pace of this attempt; a resumed attempt's warm-start time and earlier
    # steps make this a rough figure, which is all a queue page needs.
    elapsed = (timezone.now() - run.started_at).total_seconds()
    if elapsed <= 0:
        return None
    rate = run.current_step / elapsed
    return max(0.0, (run.total_steps - run.current_step) / rate)


def stale_cutoff(seconds: float):
    return timezone.now() - timedelta(seconds=seconds)


def metric_series_many(
    run_ids: list[int],
    keys: list[str],
    *,
    start: int | None = None,
    end: int | None = None,
) -> dict[int, dict[str, Any]]:
    """``{run_id: {"steps": [...], "series": {key: [...]}}}`` for many runs in ONE query.

    Full resolution in [start, end]: the dashboards downsample on their side
    with a method that keeps spikes (dashboard/downsample.py). Every run asked
    for is in the result, with empty lists when it has no stored steps yet;
    a key missing at a step reads as None.
    """
    ids = list(dict.fromkeys(int(r) for r in run_ids))
    out: dict[int, dict[str, Any]] = {
        rid: {"steps": [], "series": {key: [] for key in keys}} for rid in ids
    }
    if not ids:
        return out
    rows = MetricStep.objects.filter(run_id__in=ids)
    if start is not None:
        rows = rows.filter(step__gte=start)
    if end is not None:
        rows = rows.filter(step__lte=end)
    aliases = {f"k{i}": key for i, key in enumerate(keys)}
    rows = rows.annotate(**{a: _extract(k) for a, k in aliases.items()})
    for row in rows.order_by("run_id", "step").values_list("run_id", "step", *aliases):
        entry = out[row[0]]
        entry["steps"].append(row[1])
        for i, key in enumerate(keys):
            entry["series"][key].append(row[i + 2])
    return out


def last_metric_steps(run_ids: list[int]) -> dict[int, int]:
    """The last stored step of each run that has any (one query)."""
    rows = (
        MetricStep.objects.filter(run_id__in=list(run_ids))
        .values("run_id")
        .annotate(last=Max("step"))
        .values_list("run_id", "last")
    )
    return dict(rows)
