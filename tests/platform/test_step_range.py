"""The whole documented step range is stored: an MLflow step of 2^31 - 1 (once an
'integer out of range' 500 on PostgreSQL), 2^31 and up to 2^53 - 1 land in 64-bit
columns (every table that stores a step: MetricStep.step, Run.current_step and
total_steps, MetricColumn.chunk, Run.metric_chunks_sealed, CheckpointExport.step)
and read back exactly, sealed into columns too; beyond the range is a 400 in
MLflow's error shape, never a 500. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from test_tracking_api import Mlflow

from lab.runs.metrics.read import metric_series_many
from lab.runs.metrics.seal import seal_metrics
from lab.runs.models import MetricStep, Run
from lab.tracking.payload import MAX_STEP

# What the database itself decides (docs/design.md 4): also run on PostgreSQL.
pytestmark = pytest.mark.database

STEPS = [0, 2**31 - 1, 2**31, 2**40 + 7, MAX_STEP]


@pytest.fixture
def ml(user):
    return Mlflow(user)


def test_steps_up_to_the_bound_are_stored_and_read_back(ml):
    experiment = ml.ok("POST", "experiments/create", {"name": "steps"})["experiment_id"]
    run_id = ml.run(experiment)
    metrics = [
        {"key": "train/reward", "value": float(i), "timestamp": 1000 + i, "step": step}
        for i, step in enumerate(STEPS)
    ]
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": metrics})
    ml.ok("POST", "runs/log-metric", {"run_id": run_id, "key": "loss", "value": 1.5,
                                      "timestamp": 9, "step": 2**31 - 1})  # fmt: skip
    assert sorted(MetricStep.objects.filter(run_id=run_id).values_list("step", flat=True)) == STEPS
    run = Run.objects.get(pk=run_id)
    assert run.current_step == len(STEPS)  # steps stored (tracking/points.py)
    history = ml.ok("GET", "metrics/get-history", {"run_id": run_id, "metric_key": "train/reward"})
    assert [p["step"] for p in history["metrics"]] == STEPS
    ml.ok("POST", "runs/update", {"run_id": run_id, "status": "FINISHED", "end_time": 99})
    seal_metrics(int(run_id))  # final: every chunk sealed into columns, chunk = step // 512
    run.refresh_from_db()
    assert run.metric_chunks_sealed == MAX_STEP // 512 + 1
    series = metric_series_many([int(run_id)], ["reward/mean"])
    steps, values = series[int(run_id)].series["reward/mean"]
    assert [int(s) for s in steps] == STEPS and list(values) == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("step", [MAX_STEP + 1, 2**63, -1])
def test_a_step_outside_the_range_is_a_400(ml, step):
    experiment = ml.ok("POST", "experiments/create", {"name": "steps"})["experiment_id"]
    run_id = ml.run(experiment)
    for route, body in (
        ("runs/log-batch", {"run_id": run_id, "metrics": [
            {"key": "loss", "value": 1.0, "timestamp": 1, "step": step}]}),
        ("runs/log-metric", {"run_id": run_id, "key": "loss", "value": 1.0, "timestamp": 1,
                             "step": step}),
    ):  # fmt: skip
        code, answer = ml.call("POST", route, body)
        assert code == 400 and answer["error_code"] == "INVALID_PARAMETER_VALUE", (code, answer)
    assert not MetricStep.objects.filter(run_id=run_id).exists()
