"""How logged points become the lab's metric rows (the caller holds the run's lock).

An MLflow or TensorBoard point ``(key, value, timestamp, step)`` is stored under
the lab's key for it (``metric_map.lab_key``: the framework's name mapped, an
unmapped one as it is), merged into the step's ``MetricStep`` row; a per-expert
point (``experts/load/L{i}/E{j}`` style) becomes one element of the layer's load
vector. A retried batch changes nothing and writes nothing.
"""

from __future__ import annotations

from typing import Any

from lab.runs.metrics.ingest import upsert_steps
from lab.runs.models import MetricStep, Run
from lab.tracking import metric_map
from lab.tracking.models import TrackedRun
from lab.tracking.payload import Point
from trainer import metric_keys as mk


def store_points(run: Run, tracked: TrackedRun, points: list[Point]) -> int:
    """Merge ``points`` into the run's metric rows (the caller holds the run's lock)."""
    framework = run.source.get("framework", "")
    if not framework:
        framework = metric_map.detect_framework({p.key for p in points})
        if framework:
            run.source = {**run.source, "framework": framework}
    # One value per (step, stored key): the later timestamp wins, then the later point.
    chosen: dict[tuple[int, str], Point] = {}
    stored_keys: dict[str, str] = {}
    for p in points:
        stored_key = stored_keys.get(p.key)
        if stored_key is None:
            stored_key = stored_keys[p.key] = metric_map.lab_key(p.key, framework)
            if stored_key != p.key:
                tracked.stored_as[p.key] = stored_key
        slot_key = (p.step, stored_key)
        if slot_key not in chosen or p.timestamp >= chosen[slot_key].timestamp:
            chosen[slot_key] = p
        latest = tracked.latest_metrics.get(p.key)
        if latest is None or (p.step, p.timestamp) >= (latest[2], latest[1]):
            tracked.latest_metrics[p.key] = [p.value, p.timestamp, p.step]
    by_step: dict[int, dict[str, float | None]] = {}
    for (step, key), p in chosen.items():
        by_step.setdefault(step, {})[key] = p.value
    existing = dict(
        MetricStep.objects.filter(run_id=run.pk, step__in=list(by_step)).values_list(
            "step", "values"
        )
    )
    model = run.config.setdefault("model", {})
    slots = {key: metric_map.vector_slot(key) for key in set(stored_keys.values())}
    learn_moe_layers(model, {slot[0] for slot in slots.values() if slot is not None})
    rows = []
    for step, values in by_step.items():
        before = existing.get(step)
        merged = dict(before or {})
        for key, value in values.items():
            slot = slots[key]
            if slot is None:
                merged[key] = value
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
        return len(chosen)
    run.metric_chunks_sealed = upsert_steps(run.pk, rows, run.metric_chunks_sealed)
    run.current_step = max(run.current_step, max(by_step) + 1)
    run.total_steps = max(run.total_steps, run.current_step)
    return len(chosen)


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
