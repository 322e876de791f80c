"""Metric columns: settled chunks of a run's metrics kept as binary arrays
(runs.metrics.columns, runs.metrics.seal.seal_metrics) read exactly as its rows do, and
never go stale when rows are rewritten."""

from __future__ import annotations

import math

import numpy as np
import pytest
from lab_processes import submit_tiny_run

from lab.jobs import services as jobs
from lab.jobs import tasks
from lab.jobs.tailer import MetricsTail
from lab.jobs.watch import Supervision, ingest
from lab.runs import lifecycle
from lab.runs.metrics import read
from lab.runs.metrics.columns import CHUNK_STEPS, decode_column, decode_steps, encode_columns
from lab.runs.metrics.ingest import drop_metrics_after, ingest_metrics
from lab.runs.metrics.seal import seal_metrics, seal_unsealed_runs
from lab.runs.models import MetricColumn, Run, RunStatus

# What the database itself decides (docs/design.md 4): also run on PostgreSQL.
pytestmark = pytest.mark.database

C = CHUNK_STEPS


def _status(run: Run, status: str) -> None:
    Run.objects.filter(pk=run.pk).update(status=status)


def _sealed(run: Run) -> int:
    run.refresh_from_db()
    chunks = set(MetricColumn.objects.filter(run=run).values_list("chunk", flat=True))
    assert chunks <= set(range(run.metric_chunks_sealed))  # never a column past the prefix
    return run.metric_chunks_sealed


def _a(steps) -> list[dict]:
    return [{"step": s, "a": float(s)} for s in steps]


# --------------------------------------------------------------------------- layout
def test_encode_columns_by_hand():
    rows = [
        (0, {"a": 1.5, "b": None, "experts/load/L0": [0.5, 0.5]}),
        (2, {"a": 2, "b": "text"}),
        (5, {"a": True, "experts/load/L0": None}),
    ]
    steps, columns = encode_columns(rows)
    assert steps == np.array([0, 2, 5], dtype="<i8").tobytes()
    # "a" is at every step: its column shares the chunk's steps (stored empty)
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
N_STEPS = 2 * C + 300  # two full chunks and a tail


def _varied_records(n: int) -> list[dict]:
    """Dense, sparse and null-bearing scalars, vectors with a null, a string, and a
    run of steps never logged (a chunk boundary inside it)."""
    out = []
    for s in range(n):
        if C - 20 <= s < C + 10:
            continue
        record = {"step": s, "reward/mean": math.sin(s), "policy/loss": None if s % 7 == 3 else -s}
        if s % 10 == 0:
            record["eval/accuracy"] = s / n
        if s % 3 == 0:
            record["experts/load/L0"] = None if s == 9 else [s / n, 1 - s / n]
        if s == 11:
            record["reward/mean"] = "oops"
        out.append(record)
    return out


def _same(a: read.RunSeries, b: read.RunSeries) -> None:
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


WINDOWS = [
    (None, None),
    (5, 31),
    (-10, 3),
    (C - 30, C + 40),  # across a chunk boundary, inside the never-logged steps
    (2 * C - 5, 2 * C + 5),  # from the last sealed chunk of a training run into its tail
    (C + 100, None),
    (None, C + 100),
    (N_STEPS - 10, N_STEPS + 100),
    (N_STEPS + 10, N_STEPS + 20),  # past every step
]


@pytest.mark.parametrize("window", WINDOWS, ids=[f"{a}..{b}" for a, b in WINDOWS])
def test_sealed_runs_read_exactly_as_their_rows(user, experiment, window):
    rows_run, training, finished = (submit_tiny_run(user, experiment) for _ in range(3))
    for run in (rows_run, training, finished):
        ingest_metrics(run.pk, _varied_records(N_STEPS))
    _status(rows_run, RunStatus.SUCCEEDED)
    _status(training, RunStatus.RUNNING)
    _status(finished, RunStatus.SUCCEEDED)
    assert seal_metrics(training.pk) == 2  # the tail's chunk is not settled
    assert seal_metrics(finished.pk) == 3
    keys = ["reward/mean", "policy/loss", "eval/accuracy", "experts/load/L0", "never/logged"]
    start, end = window
    data = read.metric_series_many(
        [rows_run.pk, training.pk, finished.pk], keys, start=start, end=end
    )
    _same(data[rows_run.pk], data[training.pk])
    _same(data[rows_run.pk], data[finished.pk])
    assert _sealed(rows_run) == 0


def test_a_read_is_two_queries_whatever_the_runs(user, experiment, django_assert_num_queries):
    ids = []
    for i in range(6):
        run = submit_tiny_run(user, experiment)
        ingest_metrics(run.pk, [{"step": s, "a": s * i} for s in range(C + 30)])
        _status(run, RunStatus.SUCCEEDED if i % 3 else RunStatus.RUNNING)
        if i % 2:
            seal_metrics(run.pk)
        ids.append(run.pk)
    with django_assert_num_queries(2):
        data = read.metric_series_many(ids, ["a"])
    for i, rid in enumerate(ids):
        assert data[rid].series["a"][1].tolist() == [float(s * i) for s in range(C + 30)]


# --------------------------------------------------------------------------- lifecycle
def test_chunks_are_sealed_once_settled(user, experiment):
    run = submit_tiny_run(user, experiment)
    _status(run, RunStatus.RUNNING)
    ingest_metrics(run.pk, _a(range(C)))
    assert seal_metrics(run.pk) == 0  # chunk 0 may still grow
    ingest_metrics(run.pk, _a(range(C, C + 1)))
    assert seal_metrics(run.pk) == 1 and _sealed(run) == 1
    assert seal_metrics(run.pk) == 1  # idempotent
    assert MetricColumn.objects.filter(run=run).count() == 2  # steps and "a" of chunk 0
    _status(run, RunStatus.FAILED)
    assert seal_metrics(run.pk) == 2  # final: the last chunk too


def test_a_rewind_unseals_from_its_chunk(user, experiment):
    run = submit_tiny_run(user, experiment)
    _status(run, RunStatus.RUNNING)
    ingest_metrics(run.pk, _a(range(3 * C + 5)))
    assert seal_metrics(run.pk) == 3
    # a resumed trainer rewrites from its checkpoint, in chunk 1
    ingest_metrics(run.pk, [{"step": C + 7, "a": -1.0}])
    assert _sealed(run) == 1
    values = read.metric_series_many([run.pk], ["a"])[run.pk].series["a"][1]
    assert values[C + 7] == -1.0 and values[C + 8] == C + 8
    # appending to the unsealed tail unseals nothing
    ingest_metrics(run.pk, _a(range(3 * C + 5, 3 * C + 9)))
    assert _sealed(run) == 1


def test_late_writes_to_a_final_run_are_read_and_resealed(user, experiment):
    run = submit_tiny_run(user, experiment)
    ingest_metrics(run.pk, _a(range(2 * C + 10)))
    _status(run, RunStatus.SUCCEEDED)
    assert seal_metrics(run.pk) == 3
    ingest_metrics(run.pk, _a([3 * C + 1]))  # a lost worker's late line, in chunk 3
    assert _sealed(run) == 3
    assert read.metric_series_many([run.pk], ["a"])[run.pk].steps[-1] == 3 * C + 1
    assert seal_unsealed_runs() == [run.pk] and _sealed(run) == 4
    assert drop_metrics_after(run.pk, C + 1) > 0  # rows past the final file
    assert _sealed(run) == 1
    assert read.metric_series_many([run.pk], ["a"])[run.pk].steps[-1] == C + 1


def test_finishing_a_run_seals_it(user, experiment):
    run = submit_tiny_run(user, experiment)
    claim = jobs.claim_run(run.pk, worker_host="w1")
    ingest_metrics(run.pk, _a(range(5)))
    assert _sealed(run) == 0
    assert jobs.finish_run(claim, status="succeeded", summary={"status": "succeeded"})
    assert _sealed(run) == 1


def test_the_worker_seals_chunks_as_training_moves_on(user, experiment, tmp_path):
    run = submit_tiny_run(user, experiment)
    claim = jobs.claim_run(run.pk, worker_host="w1")
    sup = Supervision(claim=claim, run_dir=tmp_path, tail=MetricsTail(tmp_path / "m.jsonl"))
    ingest(sup, _a(range(C - 1)))
    assert _sealed(run) == 0
    ingest(sup, _a(range(C - 1, 2 * C + 3)))
    assert sup.sealed_chunks == 2 and _sealed(run) == 2


def test_reconciler_seals_final_runs_left_without_columns(user, experiment):
    finished, training, empty = (submit_tiny_run(user, experiment) for _ in range(3))
    for run in (finished, training):
        ingest_metrics(run.pk, _a(range(2)))
    _status(finished, RunStatus.SUCCEEDED)
    _status(empty, RunStatus.CANCELLED)
    _status(training, RunStatus.RUNNING)
    assert seal_unsealed_runs() == [finished.pk]  # no rows: nothing to seal
    assert seal_unsealed_runs() == []
    ingest_metrics(finished.pk, _a([1]))  # rewritten: unsealed again
    assert _sealed(finished) == 0
    tasks.reconcile()  # the periodic task seals it again
    assert _sealed(finished) == 1 and _sealed(training) == 0


def test_a_run_failed_by_the_reconciler_is_sealed(user, experiment):
    run = submit_tiny_run(user, experiment)
    Run.objects.filter(pk=run.pk).update(max_attempts=1)
    jobs.claim_run(run.pk, worker_host="w1")
    ingest_metrics(run.pk, _a([0]))
    Run.objects.filter(pk=run.pk).update(heartbeat_at="2000-01-01T00:00:00Z")
    assert [a.action for a in jobs.reconcile_stale_runs(60)] == ["failed"]
    assert _sealed(run) == 1


def test_cancelling_a_requeued_run_seals_its_earlier_metrics(user, experiment):
    run = submit_tiny_run(user, experiment)
    ingest_metrics(run.pk, _a([0]))  # an earlier attempt's steps
    lifecycle.cancel_run(run, user=user)
    assert _sealed(run) == 1
