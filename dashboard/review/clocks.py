"""When each step of a run was logged: the ``StepClock`` a chart's time axes place the
run's steps with (dashboard/charts/time_axis.py).

* a lab run: its trainer's ``time/wall`` per step (trainer/metric_keys.py); a run
  trained before that key existed: its start plus the running sum of
  ``time/step_s`` (an estimate: it leaves out pauses and the warm start);
* an external run: the times its client logged the metric's points with (the
  latest point of each step, the one the step's row keeps: lab/tracking/history.py),
  so a chart of system metrics, logged on their own clock, is placed by theirs.

Relative time counts from the run's start (``Run.started_at``; an external run's
MLflow start time).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dashboard.charts.time_axis import StepClock
from lab.runs.metrics.read import metric_series_many
from lab.runs.models import Run
from lab.tracking.history import step_times
from lab.tracking.models import TrackedRun
from trainer import metric_keys as mk


def step_clocks(runs: Sequence[Run], key: str) -> dict[int, StepClock]:
    """{run id: StepClock} of the metric ``key`` for each run (lab runs in one read)."""
    out: dict[int, StepClock] = {}
    lab = [r for r in runs if not r.is_external]
    if lab:
        data = metric_series_many([r.pk for r in lab], [mk.TIME_WALL, mk.TIME_STEP_S])
        for run in lab:
            out[run.pk] = _lab_clock(run, data[run.pk].series)
    external = [r for r in runs if r.is_external]
    tracked = {t.run_id: t for t in TrackedRun.objects.filter(run_id__in=[r.pk for r in external])}
    for run in external:
        record = tracked.get(run.pk)
        if record is None:
            continue
        steps, ms = step_times(run, record, key)
        start = record.start_time / 1000.0 if record.start_time else None
        out[run.pk] = StepClock(steps, ms / 1000.0, start)
    return out


def _lab_clock(run: Run, series) -> StepClock:
    start = run.started_at.timestamp() if run.started_at else None
    steps, wall = series[mk.TIME_WALL]
    finite = np.isfinite(np.asarray(wall, dtype=np.float64)) if len(wall) else np.array([], bool)
    if finite.any():
        return StepClock(
            np.asarray(steps)[finite], np.asarray(wall, dtype=np.float64)[finite], start
        )
    steps, seconds = series[mk.TIME_STEP_S]
    if start is None or len(seconds) == 0:
        return StepClock(np.array([], np.int64), np.array([], np.float64), start)
    durations = np.nan_to_num(np.asarray(seconds, dtype=np.float64), nan=0.0)
    return StepClock(np.asarray(steps), start + np.cumsum(durations), start)
