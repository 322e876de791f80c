"""Reads of the points an external run logged (``MetricPoint``): MLflow's metric
history, and when each step was logged (a chart's time axes). Every point is there as it came:
its own step and timestamp, two points at one step both. One indexed query per
(run, name): the unique key's index leads with (run, key, timestamp, step).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lab.tracking import metric_map
from lab.tracking.models import MetricPoint, NonFinite, TrackedRun

_SPECIAL_JSON = {
    NonFinite.NAN: "NaN",
    NonFinite.POS_INF: "Infinity",
    NonFinite.NEG_INF: "-Infinity",
}


def metric_history(
    run_id: int, tracked: TrackedRun, key: str, offset: int = 0, limit: int | None = None
) -> tuple[list[dict[str, Any]], int]:
    """(MLflow's GetMetricHistory page: every point of the metric ``key``, the name as
    logged, in MLflow's order (timestamp, step, value), and how many there are)."""
    rows = MetricPoint.objects.filter(run_id=run_id, key=key).order_by("timestamp", "step", "value")
    total = rows.count() if offset or limit is not None else None
    page = rows[offset : offset + limit] if limit is not None else rows[offset:]
    points = [
        {
            "key": key,
            "value": value if special == NonFinite.FINITE else _SPECIAL_JSON[special],
            "timestamp": timestamp,
            "step": step,
        }
        for timestamp, step, value, special in page.values_list(
            "timestamp", "step", "value", "nonfinite"
        )
    ]
    if not points and offset == 0 and key in tracked.latest_metrics:
        points = _from_the_store(run_id, tracked, key)  # logged before points were kept
    return points, total if total is not None else len(points)


def _from_the_store(run_id: int, tracked: TrackedRun, key: str) -> list[dict[str, Any]]:
    """A run logged before every point was kept: one point per step from the metric
    store, the latest point with its own timestamp, the others the run's start."""
    from lab.runs.metrics.read import metric_series_many

    latest = tracked.latest_metrics[key]
    stored = tracked.stored_as.get(key, key)
    slot = metric_map.vector_slot(stored)
    series_key = slot[0] if slot else stored
    steps, values = metric_series_many([run_id], [series_key])[run_id].series.get(
        series_key, ((), ())
    )
    out = []
    for step, value in zip(steps, values, strict=True):
        if slot is not None:
            vector = value or []
            value = vector[slot[1]] if slot[1] < len(vector) else None
            if value is None:
                continue
        value = float(value)
        out.append(
            {
                "key": key,
                "value": value if math.isfinite(value) else "NaN",
                "timestamp": latest[1] if int(step) == latest[2] else tracked.start_time or 0,
                "step": int(step),
            }
        )
    return out


def step_times(run, tracked: TrackedRun, key: str) -> tuple[np.ndarray, np.ndarray]:
    """When each lab step of the lab key ``key`` was logged: (lab steps (n,) ascending,
    ms since the epoch (n,)), the latest point's time at each step (the point the step's
    row keeps), in one query over the points of the names stored under ``key``."""
    names = names_logged_as(tracked, key)
    rows = MetricPoint.objects.filter(run_id=run.pk, key__in=names).values_list(
        "key", "step", "timestamp"
    )
    lab_step = metric_map.lab_step_function(run.source.get("framework", ""), run.source)
    latest: dict[int, int] = {}
    for name, step, timestamp in rows:
        at = lab_step(name, step)
        if timestamp > latest.get(at, -1):
            latest[at] = timestamp
    steps = np.array(sorted(latest), dtype=np.int64)
    return steps, np.array([latest[s] for s in steps.tolist()], dtype=np.int64)


def names_logged_as(tracked: TrackedRun, key: str) -> list[str]:
    """The names an external run logged that are stored under the lab key ``key``
    (itself when logged as it is; an expert-load vector: its experts' scalars)."""
    names = [name for name, stored in tracked.stored_as.items() if stored == key]
    if key in tracked.latest_metrics and key not in tracked.stored_as:
        names.append(key)
    names += [
        n for n in tracked.latest_metrics if (slot := metric_map.vector_slot(n)) and slot[0] == key
    ]
    return names
