"""Metric columns: a final run's metrics kept as binary arrays (runs.columns,
runs.services.seal_metrics) read exactly as its rows do, and never go stale."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jobs import services as jobs
from jobs import tasks
from runs import queries
from runs import services as runs
from runs.columns import decode_column, decode_steps, encode_columns
from runs.models import STEPS_COLUMN, MetricColumn, Run, RunStatus

TINY = {"run.steps": 3, "warm_start.max_steps": 2, "rollout.prompts_per_step": 2}


def _run(user, experiment, **kw) -> Run:
    return runs.submit_run(
        owner=user, experiment=experiment, preset="moe-grpo", overrides=TINY, **kw
    )


def _final(run: Run, status: str = RunStatus.SUCCEEDED) -> None:
    Run.objects.filter(pk=run.pk).update(status=status)


def _sealed(run: Run) -> bool:
    return MetricColumn.objects.filter(run=run, key=STEPS_COLUMN).exists()


# --------------------------------------------------------------------------- layout
def test_encode_columns_by_hand():
    rows = [
        (0, {"a": 1.5, "b": None, "experts/load/L0": [0.5, 0.5]}),
        (2, {"a": 2, "b": "text"}),
        (5, {"a": True, "experts/load/L0": None}),
    ]
    steps, columns = encode_columns(rows)
    assert steps == np.array([0, 2, 5], dtype="<i8").tobytes()
    # "a" is at every step: its column shares the run's steps (stored empty)
    assert columns["a"].steps == b""
    assert columns["a"].values == np.array([1.5, 2.0, 1.0], dtype="<f8").tobytes()
    # "b" is at steps 0 and 2: a null and a string are both gaps (NaN)
    assert columns["b"].steps == np.array([0, 2], dtype="<i8").tobytes()
    assert np.isnan(np.frombuffer(columns["b"].values, dtype="<f8")).all()
    # vectors stay as stored, a stored null included
    assert columns["experts/load/L0"].values == b"[[0.5,0.5],null]"
    assert columns["experts/load/L0"].steps == np.array([0, 5], dtype="<i8").tobytes()


def test_decode_column_cuts_the_window_inclusively():
    steps, columns = encode_columns([(s, {"a": s / 2}) for s in range(0, 20, 2)])
    all_steps = decode_steps(steps)
    got_steps, values = decode_column("a", columns["a"].steps, columns["a"].values, all_steps, 4, 9)
    assert got_steps.tolist() == [4, 6, 8]
    assert values.tolist() == [2.0, 3.0, 4.0]
    empty_steps, empty = decode_column("a", b"", columns["a"].values, all_steps, 100, None)
    assert empty_steps.size == 0 and empty.size == 0


# --------------------------------------------------------------------------- same reads
def _varied_records(n: int) -> list[dict]:
    """Dense, sparse and null-bearing scalars, vectors with a null, a string."""
    out = []
    for s in range(n):
        record = {"step": s, "reward/mean": math.sin(s), "policy/loss": None if s % 7 == 3 else -s}
        if s % 10 == 0:
            record["eval/accuracy"] = s / n
        if s % 3 == 0:
            record["experts/load/L0"] = None if s == 9 else [s / n, 1 - s / n]
        if s == 11:
            record["reward/mean"] = "oops"
        out.append(record)
    return out


def _same(a: queries.RunSeries, b: queries.RunSeries) -> None:
    assert a.steps.tolist() == b.steps.tolist()
    assert a.series.keys() == b.series.keys()
    for key, (steps_a, values_a) in a.series.items():
        steps_b, values_b = b.series[key]
        assert steps_a.tolist() == steps_b.tolist(), key
        if isinstance(values_a, list):
            assert values_a == values_b, key
        else:
            assert values_a.dtype == values_b.dtype == np.float64, key
            np.testing.assert_array_equal(values_a, values_b, err_msg=key)


@pytest.mark.parametrize("window", [(None, None), (5, 31), (-10, 3), (40, 45), (60, 70)])
def test_sealed_run_reads_exactly_as_its_rows(user, experiment, window):
    rows_run, sealed_run = _run(user, experiment), _run(user, experiment)
    for run in (rows_run, sealed_run):
        runs.ingest_metrics(run.pk, _varied_records(50))
        _final(run)
    assert runs.seal_metrics(sealed_run.pk) == 4
    keys = ["reward/mean", "policy/loss", "eval/accuracy", "experts/load/L0", "never/logged"]
    start, end = window
    data = queries.metric_series_many([rows_run.pk, sealed_run.pk], keys, start=start, end=end)
    _same(data[rows_run.pk], data[sealed_run.pk])
    assert not _sealed(rows_run) and _sealed(sealed_run)


def test_a_read_of_many_sealed_runs_is_one_query(user, experiment, django_assert_num_queries):
    ids = []
    for i in range(6):
        run = _run(user, experiment)
        runs.ingest_metrics(run.pk, [{"step": s, "a": s * i} for s in range(30)])
        _final(run)
        runs.seal_metrics(run.pk)
        ids.append(run.pk)
    with django_assert_num_queries(1):
        data = queries.metric_series_many(ids, ["a"])
    assert data[ids[2]].series["a"][1].tolist() == [2.0 * s for s in range(30)]


# --------------------------------------------------------------------------- lifecycle
def test_only_a_final_run_is_sealed(user, experiment):
    run = _run(user, experiment)
    runs.ingest_metrics(run.pk, [{"step": 0, "a": 1.0}])
    assert runs.seal_metrics(run.pk) == 0 and not _sealed(run)  # queued: may still change
    _final(run, RunStatus.FAILED)
    assert runs.seal_metrics(run.pk) == 1 and _sealed(run)
    assert runs.seal_metrics(run.pk) == 1  # idempotent: rebuilt, not duplicated
    assert MetricColumn.objects.filter(run=run).count() == 2


def test_finishing_a_run_seals_it(user, experiment):
    run = _run(user, experiment)
    claim = jobs.claim_run(run.pk, worker_host="w1")
    runs.ingest_metrics(run.pk, [{"step": s, "a": float(s)} for s in range(5)])
    assert not _sealed(run)
    assert jobs.finish_run(claim, status="succeeded", summary={"status": "succeeded"})
    assert _sealed(run)


def test_writing_rows_of_a_sealed_run_removes_its_columns(user, experiment):
    run = _run(user, experiment)
    runs.ingest_metrics(run.pk, [{"step": s, "a": float(s)} for s in range(5)])
    _final(run)
    runs.seal_metrics(run.pk)
    runs.ingest_metrics(run.pk, [{"step": 5, "a": 50.0}])  # e.g. a lost worker's last lines
    assert not _sealed(run)
    assert queries.metric_series_many([run.pk], ["a"])[run.pk].series["a"][1][-1] == 50.0
    runs.seal_metrics(run.pk)
    assert runs.drop_metrics_after(run.pk, 2) == 3
    assert not _sealed(run)
    assert queries.metric_series_many([run.pk], ["a"])[run.pk].steps.tolist() == [0, 1, 2]


def test_reconciler_seals_final_runs_left_without_columns(user, experiment):
    finished, training, empty = (_run(user, experiment) for _ in range(3))
    for run in (finished, training):
        runs.ingest_metrics(run.pk, [{"step": 0, "a": 1.0}])
    _final(finished)
    _final(empty, RunStatus.CANCELLED)
    Run.objects.filter(pk=training.pk).update(status=RunStatus.RUNNING)
    assert runs.seal_unsealed_runs() == [finished.pk]  # no rows: nothing to seal
    assert runs.seal_unsealed_runs() == []
    runs.ingest_metrics(finished.pk, [{"step": 1, "a": 2.0}])
    tasks.reconcile()  # the periodic task seals it again
    assert _sealed(finished) and not _sealed(training)


def test_a_run_failed_by_the_reconciler_is_sealed(user, experiment):
    run = _run(user, experiment)
    Run.objects.filter(pk=run.pk).update(max_attempts=1)
    jobs.claim_run(run.pk, worker_host="w1")
    runs.ingest_metrics(run.pk, [{"step": 0, "a": 1.0}])
    Run.objects.filter(pk=run.pk).update(heartbeat_at="2000-01-01T00:00:00Z")
    assert [a.action for a in jobs.reconcile_stale_runs(60)] == ["failed"]
    assert _sealed(run)


def test_cancelling_a_requeued_run_seals_its_earlier_metrics(user, experiment):
    run = _run(user, experiment)
    runs.ingest_metrics(run.pk, [{"step": 0, "a": 1.0}])  # an earlier attempt's steps
    runs.cancel_run(run, user=user)
    assert _sealed(run)
