"""Every write to runs, metrics and comments (views, API and CLI call these).

Each function is one transaction. State changes that race with a worker
(cancel, claim, finish) are conditional UPDATEs on the status column, so two
actors can never both win.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, Max, OuterRef
from django.utils import timezone

from experiments.models import Experiment, Sweep
from jobs.dispatch import new_task_id, send_run_on_commit
from runs.columns import CHUNK_STEPS, chunk_of, encode_columns, first_step
from runs.configs import Overrides, resolve_config, strip_config_path
from runs.models import (
    FINAL_STATUSES,
    STEPS_COLUMN,
    Comment,
    MetricColumn,
    MetricStep,
    Run,
    RunStatus,
)
from trainer.config import ConfigError, ExperimentConfig
from trainer.study import StudyDefinition

MAX_SWEEP_RUNS = 256


class NotAllowed(Exception):
    """The user may view but not change this run (only the owner or staff may)."""


class InvalidState(Exception):
    """The run's status does not allow this change."""


def check_queue(queue: str | None) -> str:
    queue = queue or settings.LAB_DEFAULT_QUEUE
    if queue not in settings.LAB_QUEUES:
        known = ", ".join(settings.LAB_QUEUES)
        raise ConfigError([("queue", f"unknown queue '{queue}'; choose one of: {known}")])
    return queue


def check_priority(priority: int | None) -> int:
    if priority is None:
        return 0
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise ConfigError([("priority", "priority must be an integer from 0 to 9")])
    return priority


def run_dir_for(run: Run) -> Path:
    return Path(settings.RUNS_DIR) / f"run-{run.pk:06d}"


@transaction.atomic
def create_run(
    *,
    owner,
    experiment: Experiment,
    config: ExperimentConfig,
    queue: str | None = None,
    priority: int | None = None,
    variant: str = "",
    preset: str = "",
    sweep: Sweep | None = None,
) -> Run:
    """Store a queued run and publish its wake-up after commit."""
    queue = check_queue(queue)
    priority = check_priority(priority)
    data = config.to_dict()
    run = Run.objects.create(
        experiment=experiment,
        sweep=sweep,
        owner=owner,
        variant=variant[:200],
        preset=preset,
        config=data,
        seed=data["run"]["seed"],
        queue=queue,
        priority=priority,
        max_attempts=settings.LAB_MAX_ATTEMPTS,
        total_steps=data["run"]["steps"],
        task_id=new_task_id(),
        queued_at=timezone.now(),
    )
    run.run_dir = str(run_dir_for(run))
    run.save(update_fields=["run_dir"])
    send_run_on_commit(run.pk, run.queue, run.priority, run.task_id)
    return run


def submit_run(
    *,
    owner,
    experiment: Experiment,
    config: Mapping[str, Any] | None = None,
    preset: str | None = None,
    overrides: Overrides = None,
    queue: str | None = None,
    priority: int | None = None,
    variant: str = "",
) -> Run:
    """Resolve and validate, then create: a bad config raises before anything is stored."""
    queue = check_queue(queue)
    priority = check_priority(priority)
    cfg = resolve_config(config, preset, overrides, base=experiment.base_config or None)
    return create_run(
        owner=owner,
        experiment=experiment,
        config=cfg,
        queue=queue,
        priority=priority,
        variant=variant or preset or "",
        preset=preset or "",
    )


@transaction.atomic
def clone_run(run: Run, *, owner, overrides: Overrides = None, queue: str | None = None) -> Run:
    """A new queued run with the source's config plus overrides."""
    cfg = resolve_config(run.config, None, overrides)
    return create_run(
        owner=owner,
        experiment=run.experiment,
        config=cfg,
        queue=queue or run.queue,
        priority=run.priority,
        variant=run.variant,
        preset=run.preset,
    )


def cancel_run(run: Run, *, user) -> Run:
    """Cooperative cancel. A queued run is cancelled without starting; a running
    run gets the flag its worker polls (the worker SIGTERMs the trainer, which
    checkpoints and exits). A finished run is left as it is."""
    if not run.can_manage(user):
        raise NotAllowed("only the run's owner or staff can cancel it")
    now = timezone.now()
    with transaction.atomic():
        cancelled = Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
            status=RunStatus.CANCELLED, cancel_requested=True, finished_at=now
        )
        if not cancelled:
            Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(cancel_requested=True)
    if cancelled:  # a requeued run keeps its earlier attempts' metrics
        seal_metrics(run.pk)
    run.refresh_from_db()
    return run


@transaction.atomic
def delete_run(run: Run, *, user) -> None:
    if not run.can_manage(user):
        raise NotAllowed("only the run's owner or staff can delete it")
    locked = Run.objects.select_for_update().get(pk=run.pk)
    if locked.status == RunStatus.RUNNING:
        raise InvalidState("cancel the run and wait for it to stop before deleting it")
    locked.delete()


# --------------------------------------------------------------------------- sweeps
def expand_grid(
    grid: Mapping[str, Sequence[Any]], seeds: Sequence[int]
) -> list[tuple[str, dict[str, Any]]]:
    """(variant label, overrides) for every combination of grid values x seeds."""
    if not isinstance(grid, Mapping):
        raise ConfigError([("grid", "the grid must map field paths to lists of values")])
    errors = []
    for path, values in grid.items():
        if not isinstance(values, list | tuple) or not values:
            errors.append((f"grid.{path}", "give a non-empty list of values"))
    if not isinstance(seeds, list | tuple) or not seeds:
        errors.append(("seeds", "give at least one seed"))
    elif not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        errors.append(("seeds", "seeds must be non-negative integers"))
    if errors:
        raise ConfigError(errors)
    paths = list(grid)
    combos = list(itertools.product(*(grid[p] for p in paths)))
    if len(combos) * len(seeds) > MAX_SWEEP_RUNS:
        raise ConfigError(
            [("grid", f"{len(combos) * len(seeds)} runs; a sweep holds at most {MAX_SWEEP_RUNS}")]
        )
    out = []
    for combo in combos:
        label = ", ".join(f"{p.split('.')[-1]}={v}" for p, v in zip(paths, combo, strict=True))
        for seed in seeds:
            overrides = dict(zip(paths, combo, strict=True))
            overrides["run.seed"] = seed
            out.append((label or "base", overrides))
    return out


def preview_sweep(
    base_config: Mapping[str, Any], grid: Mapping[str, Sequence[Any]], seeds: Sequence[int]
) -> list[tuple[str, ExperimentConfig]]:
    """Validate every run of the sweep; raises ConfigError naming grid.<path> on a bad value."""
    runs = []
    for label, overrides in expand_grid(grid, seeds):
        try:
            cfg = resolve_config(base_config, None, overrides)
        except ConfigError as exc:
            bad = [
                (f"grid.{strip_config_path(p)}" if strip_config_path(p) in grid else p, m)
                for p, m in exc.errors
            ]
            raise ConfigError(bad) from None
        runs.append((label, cfg))
    return runs


@transaction.atomic
def create_sweep(
    *,
    owner,
    experiment: Experiment,
    base_config: Mapping[str, Any],
    grid: Mapping[str, Sequence[Any]],
    seeds: Sequence[int],
    queue: str | None = None,
    name: str = "",
) -> Sweep:
    """Validate every combination first; store the sweep and its runs only if all pass."""
    queue = check_queue(queue)
    planned = preview_sweep(base_config, grid, seeds)
    sweep = Sweep.objects.create(
        experiment=experiment,
        owner=owner,
        name=name[:200],
        base_config=dict(base_config),
        grid=dict(grid),
        seeds=list(seeds),
        queue=queue,
    )
    for label, cfg in planned:
        create_run(
            owner=owner, experiment=experiment, config=cfg, queue=queue, variant=label, sweep=sweep
        )
    return sweep


@transaction.atomic
def create_study_sweep(
    *,
    owner,
    experiment: Experiment,
    definition: Mapping[str, Any],
    queue: str | None = None,
    overrides: Sequence[str] = (),
) -> Sweep:
    """Queue a stability study (trainer/study.py) as a sweep: one run per variant x seed.

    The same definition that ``python -m trainer study`` runs; every config is
    validated first (errors name ``variants.<name>.<field>``), so a bad study
    stores nothing.
    """
    queue = check_queue(queue)
    study = StudyDefinition.from_dict(dict(definition))
    planned = [
        (variant.name, study.config_for(variant, seed, list(overrides)))
        for variant in study.variants
        for seed in study.seeds
    ]
    if len(planned) > MAX_SWEEP_RUNS:
        raise ConfigError([("variants", f"{len(planned)} runs; at most {MAX_SWEEP_RUNS}")])
    sweep = Sweep.objects.create(
        experiment=experiment,
        owner=owner,
        name=(study.name or "study")[:200],
        base_config=planned[0][1].to_dict(),
        grid={},
        seeds=list(study.seeds),
        queue=queue,
        study=dict(definition),
    )
    for variant, cfg in planned:
        create_run(
            owner=owner,
            experiment=experiment,
            config=cfg,
            queue=queue,
            variant=variant,
            sweep=sweep,
        )
    return sweep


# --------------------------------------------------------------------------- metrics
def ingest_metrics(run_id: int, records: Iterable[Mapping[str, Any]]) -> int:
    """Upsert metric lines (``{"step": n, key: value, ...}``) in one statement.

    Idempotent per (run, step): a line read twice, or rewritten by a resumed
    trainer, replaces the stored row instead of adding one. A line landing in
    a sealed chunk (a rewind) unseals it and the chunks after it. Returns
    rows written.
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
        _, sealed = _lock_run(run_id)
        MetricStep.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["run", "step"],
            update_fields=["values"],
            batch_size=1000,
        )
        first = chunk_of(min(by_step))
        if first < sealed:
            _unseal(run_id, first)
    return len(rows)


def drop_metrics_after(run_id: int, last_step: int) -> int:
    """Remove rows past the trainer's final metrics file (steps it rewound and never redid)."""
    with transaction.atomic():
        _, sealed = _lock_run(run_id)
        deleted, _ = MetricStep.objects.filter(run_id=run_id, step__gt=last_step).delete()
        first = chunk_of(last_step + 1)
        if deleted and first < sealed:
            _unseal(run_id, first)
    return deleted


def seal_metrics(run_id: int) -> int:
    """Copy the run's settled metric chunks into columns (``MetricColumn``); returns
    how many leading chunks are sealed now (``Run.metric_chunks_sealed``).

    A chunk is settled once the run has rows in a later chunk (training
    moves forward) or the run is final (then its last chunk too). Only
    chunks not sealed yet are read and written, so calling this after every
    ingestion costs one small query until a chunk settles. Idempotent.
    Called by the worker while it ingests (jobs.supervisor), when a run
    becomes final (jobs.services), and by the reconciler for final runs left
    with rows past their columns.
    """
    with transaction.atomic():
        status, sealed = _lock_run(run_id)
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


def _lock_run(run_id: int) -> tuple[str | None, int]:
    """Lock the run's row for this transaction (PostgreSQL; SQLite's IMMEDIATE
    transactions already serialise writers); returns (status, sealed chunks),
    (None, 0) for no such run.

    Every write of a run's metric rows and every sealing takes this lock first,
    so a sealing never reads the rows while a write it would miss is in
    flight: either the write commits first and the sealing reads it, or the
    sealing commits first and the write sees the chunks it must unseal.
    """
    row = (
        Run.objects.select_for_update()
        .filter(pk=run_id)
        .values_list("status", "metric_chunks_sealed")
        .first()
    )
    return row if row is not None else (None, 0)


def _unseal(run_id: int, first: int) -> None:
    """Rows of chunk ``first`` changed: it and every later chunk stop being columns."""
    MetricColumn.objects.filter(run_id=run_id, chunk__gte=first).delete()
    Run.objects.filter(pk=run_id).update(metric_chunks_sealed=first)


# --------------------------------------------------------------------------- comments
def add_comment(*, author, body: str, run: Run | None = None, experiment=None) -> Comment:
    body = (body or "").strip()
    if not body:
        raise ConfigError([("body", "a comment cannot be empty")])
    if len(body) > 10000:
        raise ConfigError([("body", "a comment holds at most 10000 characters")])
    if run is None and experiment is None:
        raise ConfigError([("run", "comment on a run or an experiment")])
    return Comment.objects.create(author=author, body=body, run=run, experiment=experiment)
