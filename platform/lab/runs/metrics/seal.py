"""Sealing: copy a run's settled metric chunks from rows into columns, and undo it.

The rows (``MetricStep``) are the truth; the columns (``MetricColumn``,
layout in metrics/columns.py) are a faster copy of every chunk a run has
moved past. Every write of a run's rows and every sealing first locks the
run's row (``lock_run``), so the two never miss each other.
"""

from __future__ import annotations

import itertools
from typing import Any

from django.db import transaction
from django.db.models import Exists, Max, OuterRef

from lab.runs.metrics.columns import CHUNK_STEPS, chunk_of, encode_columns, first_step
from lab.runs.models import FINAL_STATUSES, STEPS_COLUMN, MetricColumn, MetricStep, Run


def seal_metrics(run_id: int) -> int:
    """Copy the run's settled metric chunks into columns (``MetricColumn``); returns
    how many leading chunks are sealed now (``Run.metric_chunks_sealed``).

    A chunk is settled once the run has rows in a later chunk (training
    moves forward) or the run is final (then its last chunk too). Only
    chunks not sealed yet are read and written, so calling this after every
    ingestion costs one small query until a chunk settles. Idempotent.
    Called by the worker while it ingests (jobs.watch), when a run
    becomes final (jobs.services), and by the reconciler for final runs left
    with rows past their columns.
    """
    with transaction.atomic():
        status, sealed = lock_run(run_id)
        if status is None:
            return 0
        tail = MetricStep.objects.filter(run_id=run_id, step__gte=first_step(sealed))
        last = tail.aggregate(last=Max("step"))["last"]
        if last is None:
            return sealed
        # chunks [sealed, upto) are settled
        upto = chunk_of(last) + 1 if status in FINAL_STATUSES else chunk_of(last)
        if upto <= sealed:
            return sealed
        rows = tail.filter(step__lt=first_step(upto)).order_by("step").values_list("step", "values")
        columns = []
        for chunk, chunk_rows in itertools.groupby(
            rows.iterator(chunk_size=500), key=_chunk_of_row
        ):
            steps, encoded = encode_columns(chunk_rows)
            columns.append(
                MetricColumn(run_id=run_id, chunk=chunk, key=STEPS_COLUMN, steps=steps, values=b"")
            )
            columns += [
                MetricColumn(run_id=run_id, chunk=chunk, key=key, steps=c.steps, values=c.values)
                for key, c in encoded.items()
            ]
        # A chunk with no rows (steps never logged) gets no columns: a reader finds
        # no steps there, as in the rows. Nothing is stored at or past `sealed`
        # (unsealing removes it); the delete only keeps a rebuild from colliding.
        MetricColumn.objects.filter(run_id=run_id, chunk__gte=sealed).delete()
        MetricColumn.objects.bulk_create(columns, batch_size=200)
        Run.objects.filter(pk=run_id).update(metric_chunks_sealed=upto)
    return upto


def _chunk_of_row(row: tuple[int, Any]) -> int:
    return chunk_of(row[0])


def seal_unsealed_runs(limit: int = 20) -> list[int]:
    """Seal up to ``limit`` final runs that have rows past their sealed chunks (oldest
    finished first); returns their ids. The reconciler calls this every tick:
    runs finished before columns existed, a lost worker's late lines."""
    unsealed_rows = Exists(
        MetricStep.objects.filter(
            run=OuterRef("pk"), step__gte=OuterRef("metric_chunks_sealed") * CHUNK_STEPS
        )
    )
    pending = list(
        Run.objects.filter(unsealed_rows, status__in=FINAL_STATUSES)
        .order_by("finished_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    for run_id in pending:
        seal_metrics(run_id)
    return pending


def lock_run(run_id: int) -> tuple[str | None, int]:
    """Lock the run's row for this transaction (PostgreSQL; SQLite's IMMEDIATE
    transactions already serialise writers); returns (status, sealed chunks),
    (None, 0) for no such run.

    Every write of a run's metric rows and every sealing takes this lock first,
    so a sealing never reads the rows while a write it would miss is in
    flight: either the write commits first and the sealing reads it, or the
    sealing commits first and the write sees the chunks it must unseal.
    """
    row = _locking(Run.objects, run_id).values_list("status", "metric_chunks_sealed").first()
    return row if row is not None else (None, 0)


def lock_run_record(run_id: int) -> Run | None:
    """``lock_run``'s lock, taken by reading the whole run, deleted or not (None for no
    such run): a writer that needs the run's fields reads them under the lock in the
    same query instead of a second one."""
    return _locking(Run.all_objects, run_id).first()


def _locking(manager, run_id: int):
    """The one query that locks a run's row (SELECT ... FOR UPDATE on PostgreSQL)."""
    return manager.select_for_update().filter(pk=run_id)


def unseal_from(run_id: int, first: int) -> None:
    """Rows of chunk ``first`` changed: it and every later chunk stop being columns."""
    MetricColumn.objects.filter(run_id=run_id, chunk__gte=first).delete()
    Run.objects.filter(pk=run_id).update(metric_chunks_sealed=first)
