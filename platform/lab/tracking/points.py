"""How logged points are stored (the caller holds the run's lock), twice:

* as they came, in ``MetricPoint`` (name as logged, step, own timestamp,
  value): MLflow's metric history, every point kept (two at one step are two
  rows; the same point sent again is one);
* merged into the lab's metric store: under the lab's key for the name
  (``metric_map.lab_key``: the framework's name mapped, an unmapped one as it
  is), in the step's ``MetricStep`` row, the later timestamp's value where a
  step has several; a per-expert point (``experts/load/L{i}/e{j}``) becomes one
  element of the layer's load vector. This is what charts, compare and the
  stability review read, as for a lab run.

A retried batch changes nothing and writes no step row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connection

from lab.runs.metrics.ingest import upsert_steps
from lab.runs.models import MetricStep, Run
from lab.tracking import metric_map
from lab.tracking.models import MetricPoint, NonFinite, TrackedRun
from lab.tracking.payload import Point
from trainer import metric_keys as mk

_POINT_FIELDS = ("run", "key", "step", "timestamp", "value", "nonfinite")


def store_points(
    run: Run,
    tracked: TrackedRun,
    points: list[Point],
    lab_step: Callable[[str, int], int] | None = None,
) -> int:
    """Keep ``points`` as logged and merge them into the run's metric rows (the caller
    holds the run's lock). ``lab_step(name, step)``: the lab step a point of that name
    and step is charted at, when the framework logs on several step axes (slime's
    rollout and train steps, tracking/tensorboard.py); the points keep their own."""
    keep_as_logged(run.pk, points)
    framework = run.source.get("framework", "")
    if not framework:
        framework = metric_map.detect_framework({p.key for p in points})
        if framework:
            run.source = {**run.source, "framework": framework}
    if lab_step is None:
        lab_step = metric_map.lab_step_function(framework, run.source)
    # One value per (step, stored key): the later timestamp wins, then the later point.
    chosen: dict[tuple[int, str], Point] = {}
    # Per name as logged, this batch's MLflow-latest point (see _later), compared with
    # the stored one once per name below rather than once per point.
    newest: dict[str, Point] = {}
    stored_keys: dict[str, str] = {}
    for p in points:
        key = p.key
        stored_key = stored_keys.get(key)
        if stored_key is None:
            stored_key = stored_keys[key] = metric_map.lab_key(key, framework)
            if stored_key != key:
                tracked.stored_as[key] = stored_key
        slot_key = (lab_step(key, p.step), stored_key)
        before = chosen.get(slot_key)
        if before is None or p.timestamp >= before.timestamp:
            chosen[slot_key] = p
        top = newest.get(key)
        if top is None or _at_least(p, top):
            newest[key] = p
    for key, p in newest.items():
        latest = tracked.latest_metrics.get(key)
        if latest is None or _later(p, latest):
            tracked.latest_metrics[key] = [p.value, p.timestamp, p.step]
    by_step: dict[int, dict[str, Any]] = {}
    for (step, key), p in chosen.items():  # step: the lab's
        by_step.setdefault(step, {})[key] = p.value
    merge_into_steps(run, by_step)
    return len(chosen)


def _rank(step: int, timestamp: int, value: float | None) -> tuple[int, int, float]:
    """MLflow's order of a run's latest value: (step, timestamp, value), as its SQL store
    keeps latest_metrics; a non-finite value (None here) ranks as 0."""
    return step, timestamp, 0.0 if value is None else value


def _at_least(p: Point, q: Point) -> bool:
    """``p`` ranks at least as late as ``q`` (the later point wins a tie)."""
    return _rank(p.step, p.timestamp, p.value) >= _rank(q.step, q.timestamp, q.value)


def _later(p: Point, latest: list) -> bool:
    """Whether ``p`` is the latest value over ``latest`` ([value, timestamp, step])."""
    return _rank(p.step, p.timestamp, p.value) >= _rank(latest[2], latest[1], latest[0])


def merge_into_steps(run: Run, by_step: dict[int, dict[str, Any]]) -> None:
    """Merge ``{step: {key: value}}`` into the run's step rows (the caller holds the
    run's lock): a scalar or a whole vector replaces the key's value; an expert's
    share (``experts/load/L{i}/e{j}``) fills one slot of the layer's vector. Rows that
    would not change are not written; the run counts the steps it has."""
    if not by_step:
        return
    existing = dict(
        MetricStep.objects.filter(run_id=run.pk, step__in=list(by_step)).values_list(
            "step", "values"
        )
    )
    model = run.config.setdefault("model", {})
    keys = {key for values in by_step.values() for key in values}
    slots = {key: metric_map.vector_slot(key) for key in keys}
    whole = {k for k in keys if k.startswith(mk.EXPERTS_LOAD_PREFIX) and slots[k] is None}
    learn_moe_layers(model, {slot[0] for slot in slots.values() if slot is not None} | whole)
    rows = []
    for step, values in by_step.items():
        before = existing.get(step)
        merged = dict(before or {})
        for key, value in values.items():
            slot = slots[key]
            if slot is None:
                merged[key] = value
                if key in whole and isinstance(value, list):
                    model["n_experts"] = max(int(model.get("n_experts") or 0), len(value))
                continue
            vector_key, index = slot
            vector = list(merged.get(vector_key) or [])
            vector += [None] * (index + 1 - len(vector))
            vector[index] = value
            merged[vector_key] = vector
            model["n_experts"] = max(int(model.get("n_experts") or 0), len(vector))
        if merged != before:  # a retried batch changes nothing and writes nothing
            rows.append(MetricStep(run_id=run.pk, step=step, values=merged))
    if not rows:
        return
    run.metric_chunks_sealed = upsert_steps(run.pk, rows, run.metric_chunks_sealed)
    # the steps stored, counted (a run logging steps 1..5 has 5, not 6)
    run.current_step += len(set(by_step) - set(existing))
    run.total_steps = max(run.total_steps, run.current_step)


def keep_as_logged(run_id: int, points: list[Point]) -> None:
    """Every point as logged, one ``MetricPoint`` row each; one already stored (a retried
    batch, the same TensorBoard event read again) is skipped by the unique key.

    One ``INSERT ... ON CONFLICT DO NOTHING`` run over all rows (the DB-API's
    executemany; SQLite and PostgreSQL both take the clause): the ORM's bulk_create
    spent 160 ms per 1,000 points building model instances and SQL, this takes a
    few (docs/benchmarks-archive.md, "MLflow ingestion")."""
    if not points:
        return
    quote = connection.ops.quote_name
    fields = [MetricPoint._meta.get_field(f).column for f in _POINT_FIELDS]
    sql = (
        f"INSERT INTO {quote(MetricPoint._meta.db_table)} ({', '.join(map(quote, fields))}) "
        f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT DO NOTHING"
    )
    nan = int(NonFinite.NAN)
    rows = [
        (run_id, p.key, p.step, p.timestamp, p.value, 0)
        if p.value is not None
        else (run_id, p.key, p.step, p.timestamp, 0.0, p.special or nan)
        for p in points
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def learn_moe_layers(model: dict[str, Any], vector_keys: set[str]) -> None:
    """The model facts the expert-load heatmaps need, from the layers whose load the run
    logs (``experts/load/L{i}``): ``n_layers`` (up to the last such layer) and
    ``dense_layers``, the layers below it that log none (Qwen's ``mlp_only_layers``,
    a model's dense first layers), so the layer pickers offer only the MoE layers.
    Layers seen in earlier batches stay MoE layers."""
    layers = {int(key[len(mk.EXPERTS_LOAD_PREFIX) :]) for key in vector_keys}
    if not layers:
        return
    n_before = int(model.get("n_layers") or 0)
    seen = (set(range(n_before)) - set(model.get("dense_layers") or [])) | layers
    model["n_layers"] = max(n_before, max(layers) + 1)
    model["dense_layers"] = sorted(set(range(model["n_layers"])) - seen)
