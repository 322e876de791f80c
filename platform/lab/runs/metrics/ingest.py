"""Writes of a run's metric rows: the worker's upsert of metrics.jsonl lines, and
the cut of rows a rewound trainer never rewrote. Each is one transaction under
the run's lock (metrics/seal.py ``lock_run``), unsealing what it changes.

A worker passes its attempt number (the fencing token, ``Run.attempts`` as its
claim left it): the write is refused with ``StaleAttempt`` when the run has
moved on to another attempt or is no longer running, checked inside the same
transaction as the write, so a frozen worker that wakes up late can never
mix its rows into the run's new attempt."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import transaction

from lab.runs.metrics.columns import chunk_of
from lab.runs.metrics.seal import lock_run, unseal_from
from lab.runs.models import MetricStep, Run, RunStatus


class StaleAttempt(Exception):
    """The writer's attempt no longer owns the run: nothing was written."""


def _check_attempt(run_id: int, attempt: int | None) -> None:
    """Inside the write's transaction, after ``lock_run``: the attempt still owns the run."""
    if attempt is None:
        return
    if not Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, attempts=attempt).exists():
        raise StaleAttempt(f"run {run_id}: attempt {attempt} no longer owns the run")


def ingest_metrics(
    run_id: int, records: Iterable[Mapping[str, Any]], *, attempt: int | None = None
) -> int:
    """Upsert metric lines (``{"step": n, key: value, ...}``) in one statement.

    Idempotent per (run, step): a line read twice, or rewritten by a resumed
    trainer, replaces the stored row instead of adding one. A line landing in
    a sealed chunk (a rewind) unseals it and the chunks after it. Returns
    rows written. ``attempt``: refuse (``StaleAttempt``) unless it is the run's
    current, running attempt.
    """
    by_step: dict[int, dict[str, Any]] = {}
    for record in records:
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            continue
        by_step[step] = {k: v for k, v in record.items() if k != "step"}
    if not by_step:
        return 0
    rows = [MetricStep(run_id=run_id, step=s, values=v) for s, v in by_step.items()]
    with transaction.atomic():
        _, sealed = lock_run(run_id)
        _check_attempt(run_id, attempt)
        upsert_steps(run_id, rows, sealed)
    return len(rows)


def upsert_steps(run_id: int, rows: list[MetricStep], sealed: int) -> int:
    """Insert these step rows or replace the stored ones (the caller holds the run's
    lock, ``lock_run``) and unseal the chunks from the first one they touch; returns
    the run's count of sealed chunks after (``sealed`` before)."""
    MetricStep.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["run", "step"],
        update_fields=["values"],
        batch_size=1000,
    )
    first = chunk_of(min(row.step for row in rows))
    if first < sealed:
        unseal_from(run_id, first)
        return first
    return sealed


def drop_metrics_after(run_id: int, last_step: int, *, attempt: int | None = None) -> int:
    """Remove rows past the trainer's final metrics file (steps it rewound and never redid);
    ``attempt`` as in ``ingest_metrics``."""
    with transaction.atomic():
        _, sealed = lock_run(run_id)
        _check_attempt(run_id, attempt)
        deleted, _ = MetricStep.objects.filter(run_id=run_id, step__gt=last_step).delete()
        first = chunk_of(last_step + 1)
        if deleted and first < sealed:
            unseal_from(run_id, first)
    return deleted
