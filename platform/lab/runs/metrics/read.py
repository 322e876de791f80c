"""Reads of the metric store: a run's series (thinned for the API), many runs'
series at full resolution (sealed columns plus the rows after them), stored keys."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db import connection
from django.db.models import Max, Min, QuerySet
from tsdownsample import MinMaxDownsampler

from lab.runs.metrics.columns import (
    chunk_of,
    decode_column,
    decode_steps,
    first_step,
    scalar_array,
    window_bounds,
)
from lab.runs.models import STEPS_COLUMN, MetricColumn, MetricStep
from trainer.metric_keys import METRIC_NAME, is_vector_key


def metric_series(
    run_id: int,
    keys: list[str],
    *,
    start: int | None = None,
    end: int | None = None,
    max_points: int = 1000,
) -> dict[str, Any]:
    """``{"steps": [...], "series": {key: [...]}}`` for steps in [start, end] (one metric read).

    Values are aligned on ``steps``; ``None`` where a step did not log the key
    or stored a null (a non-finite value). Longer ranges are thinned with the
    minimum and the maximum of equal-count buckets of each key's finite values
    (``_extreme_steps``, the rule the dashboards draw with in
    dashboard/charts/downsample.py), plus the first step of each gap: each scalar key gets
    ``max_points // len(keys)`` points (at least 4) chosen on its own series,
    the response holds the union of their steps plus the first and last step,
    so a one-step KL spike survives any ``max_points``. Every row of the
    range is read for that (one aggregated query, runs.metrics.read
    ``metric_series_many``). At most ``max_points`` steps, or 4 per key plus
    the two ends when there are more keys than ``max_points / 4``.
    """
    entry = metric_series_many([run_id], keys, start=start, end=end)[int(run_id)]
    keys = list(dict.fromkeys(keys))
    steps = entry.steps
    if steps.size > max_points:
        per_key = max(MIN_POINTS, max_points // max(1, len(keys)))
        kept = [steps[[0, -1]]]
        for key in keys:
            key_steps, values = entry.series[key]
            if is_vector_key(key):  # no extremes to keep: evenly spread
                pick = np.unique(np.linspace(0, key_steps.size - 1, per_key).astype(np.int64))
                kept.append(key_steps[pick] if key_steps.size else key_steps)
            else:
                kept.append(_extreme_steps(key_steps, values, per_key))
        steps = np.unique(np.concatenate(kept))
    return {
        "steps": steps.tolist(),
        "series": {key: _aligned(steps, *entry.series[key]) for key in keys},
    }


# Fewest points a thinned key keeps: first, last, and one extreme pair.
MIN_POINTS = 4
# Stateless, so one instance serves every call.
_MINMAX = MinMaxDownsampler()


def _extreme_steps(steps: np.ndarray, values: np.ndarray | list, budget: int) -> np.ndarray:
    """At most ``budget`` of ``steps`` (n,): the first step of every gap (a run of
    missing or non-finite values, so a line breaks there), then the minimum and the
    maximum of equal-count buckets of the finite values (tsdownsample's MinMax
    kernel), so a one-step spike is always among them."""
    y = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    finite = np.isfinite(y)
    gaps = np.flatnonzero(~finite & np.r_[True, finite[:-1]])
    if budget - gaps.size < 2:  # gaps denser than the budget: the extremes only
        gaps = gaps[:0]
    n_out = budget - gaps.size
    n_out -= n_out % 2  # the kernel returns pairs
    points = np.flatnonzero(finite)
    if points.size > n_out:
        points = points[np.unique(_MINMAX.downsample(np.ascontiguousarray(y[points]), n_out=n_out))]
    return steps[np.concatenate([gaps, points])]


def _aligned(steps: np.ndarray, key_steps: np.ndarray, values: np.ndarray | list) -> list:
    """The key's values at ``steps`` (both ascending); None where it has none or NaN."""
    if key_steps.size == 0:
        return [None] * steps.size
    at = np.minimum(np.searchsorted(key_steps, steps), key_steps.size - 1)
    present = key_steps[at] == steps
    if isinstance(values, list):  # vectors
        return [
            values[i] if ok else None for i, ok in zip(at.tolist(), present.tolist(), strict=True)
        ]
    picked = values[at]
    out = picked.astype(object)
    out[~(present & np.isfinite(picked))] = None
    return out.tolist()


def metric_keys(run_id: int) -> list[str]:
    """Keys present in the run's latest stored step."""
    row = MetricStep.objects.filter(run_id=run_id).order_by("-step").values("values").first()
    return sorted(row["values"]) if row else []


# A key missing from a step's JSON reads as this marker inside the aggregated
# text, an explicit JSON null as ``null``: Python's json module parses
# "Infinity" to +inf, and no stored value can be infinite (JSON has no
# infinity, and the trainer writes null for NaN/inf: trainer/run_folder/files.py).
_MISSING = "Infinity"
_SAFE_KEY = METRIC_NAME  # trainer/metric_keys.py: never a double quote nor a comma


@dataclass
class RunSeries:
    """The stored metrics of one run in a step range.

    ``steps``: every stored step (n,), ascending. ``series[key]`` is
    ``(steps_k, values_k)``: only the steps whose JSON HAS the key, so a
    metric logged every 10 steps is a 10x shorter series, not one with gaps.
    Scalar values are float64 arrays where NaN marks a stored null (a
    non-finite value the chart must break the line at); vector keys
    (``experts/load/L*``) are lists, ``None`` for a stored null.
    """

    steps: np.ndarray
    series: dict[str, tuple[np.ndarray, np.ndarray | list]]


def metric_series_many(
    run_ids: list[int],
    keys: list[str],
    *,
    start: int | None = None,
    end: int | None = None,
) -> dict[int, RunSeries]:
    """``{run_id: RunSeries}`` for many runs and keys in TWO queries, full resolution.

    1. Sealed chunks (``MetricColumn``, runs.metrics.seal ``seal_metrics``: every
       chunk of ``CHUNK_STEPS`` steps a run has moved past, all of a final
       run's): one query reads the asked keys' binary columns of every run's
       chunks in the window; each column is one ``np.frombuffer``.
    2. The rest of each run's window, from the rows: after its last sealed
       chunk (a training run's tail, under ``CHUNK_STEPS`` steps), or all of
       it for a run without columns. The database extracts the keys from
       each step's JSON (``->``, which keeps a stored null apart from a
       missing key: the former reads ``null``, the latter SQL NULL) and
       aggregates each run's values into one JSON array text per key, so
       Python parses one string per run and key, not one value per row.

    Both parts read the same series (tests/platform: sealed, partly sealed
    and unsealed runs give equal results); docs/benchmarks.md has the
    measurements. The dashboards downsample on their side with a method
    that keeps spikes (dashboard/charts/downsample.py). Every run asked for is in
    the result, empty when it has no stored step in the range.
    """
    ids = list(dict.fromkeys(int(r) for r in run_ids))
    keys = list(dict.fromkeys(keys))
    bad = [k for k in keys if not _SAFE_KEY.fullmatch(k)]
    if bad:
        raise ValueError(f"not a metric key: {bad[0]!r}")
    empty = np.array([], dtype=np.int64)
    out = {rid: RunSeries(empty, {k: _empty_series(k) for k in keys}) for rid in ids}
    if not ids:
        return out
    sealed, rows_from = _sealed_series(ids, keys, start, end)
    lower = {rid: rows_from.get(rid, start) for rid in ids}
    tails = _row_series(ids, keys, lower, end)
    for rid in ids:
        parts = [part for part in (sealed.get(rid), tails.get(rid)) if part is not None]
        if parts:
            out[rid] = _joined(parts, keys)
    return out


def _sealed_series(
    ids: list[int], keys: list[str], start: int | None, end: int | None
) -> tuple[dict[int, RunSeries], dict[int, int]]:
    """(RunSeries of each run's sealed chunks within [start, end], and the step the
    rows must be read from for each run that has any), in one query.

    A run's sealed chunks are a prefix (chunk 0 on), so the chunks of the
    window it has are consecutive and the rows start after the last one.
    """
    columns = MetricColumn.objects.filter(run_id__in=ids, key__in=[STEPS_COLUMN, *keys])
    if start is not None:
        columns = columns.filter(chunk__gte=chunk_of(start))
    if end is not None:
        columns = columns.filter(chunk__lte=chunk_of(end))
    by_run: dict[int, dict[int, dict[str, tuple[Any, Any]]]] = {}
    for run_id, chunk, key, steps_blob, values_blob in _fetch(
        columns.values_list("run_id", "chunk", "key", "steps", "values")
    ):
        by_run.setdefault(run_id, {}).setdefault(chunk, {})[key] = (steps_blob, values_blob)
    series: dict[int, RunSeries] = {}
    rows_from: dict[int, int] = {}
    for run_id, chunks in by_run.items():
        parts = []
        for chunk in sorted(chunks):
            blobs = chunks[chunk]
            chunk_steps = decode_steps(blobs[STEPS_COLUMN][0])
            lo, hi = window_bounds(chunk_steps, start, end)
            parts.append(
                RunSeries(
                    chunk_steps[lo:hi],
                    {
                        k: decode_column(k, *blobs[k], chunk_steps, start, end)
                        if k in blobs
                        else _empty_series(k)
                        for k in keys
                    },
                )
            )
        series[run_id] = _joined(parts, keys)
        after = first_step(max(chunks) + 1)
        rows_from[run_id] = after if start is None else max(start, after)
    return series, rows_from


def _fetch(rows: QuerySet) -> list[tuple]:
    """The rows of a ``values_list`` queryset; on PostgreSQL with binary results.

    Django reads PostgreSQL results as text, where a bytea arrives hex-encoded
    (twice its size) and is decoded in Python: for the column read of 20 runs
    x 20,000 steps that took about twice as long as the binary transfer
    (docs/benchmarks.md). Same SQL, same connection and transaction; the
    query still goes through Django's cursor wrapper, so it is logged and
    counted like any other.
    """
    if connection.vendor != "postgresql":
        return list(rows)
    import psycopg

    sql, params = rows.query.sql_with_params()
    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)  # server-side binding: binary results
    raw.format = psycopg.pq.Format.BINARY
    wrap = connection.make_debug_cursor if connection.queries_logged else connection.make_cursor
    with wrap(raw) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _joined(parts: list[RunSeries], keys: list[str]) -> RunSeries:
    """The parts one after another (each part's steps all after the previous one's)."""
    if len(parts) == 1:
        return parts[0]
    series: dict[str, tuple[np.ndarray, np.ndarray | list]] = {}
    for key in keys:
        steps = np.concatenate([p.series[key][0] for p in parts])
        if is_vector_key(key):
            series[key] = (steps, [v for p in parts for v in p.series[key][1]])
        else:
            series[key] = (steps, np.concatenate([p.series[key][1] for p in parts]))
    return RunSeries(np.concatenate([p.steps for p in parts]), series)


def _row_series(
    ids: list[int], keys: list[str], lower: dict[int, int | None], end: int | None
) -> dict[int, RunSeries]:
    """RunSeries from the step rows of each run from ``lower[run]`` to ``end`` (one
    query); runs with no row there are left out."""
    out = {}
    for run_id, steps_text, *columns in _aggregated_rows(ids, keys, lower, end):
        steps = np.asarray(json.loads(steps_text), dtype=np.int64)
        parsed = [json.loads(text) for text in columns]
        if steps.size > 1 and np.any(np.diff(steps) < 0):
            # SQLite's group_concat follows the subquery's order in practice, not by contract.
            order = np.argsort(steps, kind="stable")
            steps = steps[order]
            parsed = [[values[i] for i in order] for values in parsed]
        out[run_id] = RunSeries(
            steps, {k: _present(k, steps, v) for k, v in zip(keys, parsed, strict=True)}
        )
    return out


def _empty_series(key: str) -> tuple[np.ndarray, np.ndarray | list]:
    empty = np.array([], dtype=np.int64)
    return (empty, []) if is_vector_key(key) else (empty, np.array([], dtype=np.float64))


def _present(key: str, steps: np.ndarray, values: list) -> tuple[np.ndarray, np.ndarray | list]:
    """Drop the steps where the key is missing (the +inf marker)."""
    if is_vector_key(key):
        keep = [i for i, v in enumerate(values) if not (type(v) is float and v == math.inf)]
        return steps[keep], [values[i] for i in keep]
    array = scalar_array(values)
    present = array != math.inf
    if present.all():
        return steps, array
    return steps[present], array[present]


def _aggregated_rows(
    ids: list[int], keys: list[str], lower: dict[int, int | None], end: int | None
):
    """(run_id, steps JSON array, one JSON array per key) per run with stored steps
    in its range: from ``lower[run_id]`` (None: the first step) to ``end``."""
    table = connection.ops.quote_name(MetricStep._meta.db_table)
    run_col = connection.ops.quote_name(MetricStep._meta.get_field("run").column)
    step = connection.ops.quote_name("step")
    values = connection.ops.quote_name("values")
    # Runs sharing a lower bound share one IN (...) term: one term in the common
    # cases (nothing sealed, or a whole window from the rows).
    by_bound: dict[int | None, list[int]] = {}
    for rid in ids:
        by_bound.setdefault(lower[rid], []).append(rid)
    terms, where_params = [], []
    for bound, rids in by_bound.items():
        term = f"{run_col} IN ({', '.join(['%s'] * len(rids))})"
        where_params += rids
        if bound is not None:
            term += f" AND {step} >= %s"
            where_params.append(int(bound))
        terms.append(f"({term})")
    where = [f"({' OR '.join(terms)})"]
    if end is not None:
        where.append(f"{step} <= %s")
        where_params.append(int(end))
    if connection.vendor == "postgresql":
        cols = [f"'[' || string_agg({step}::text, ',' ORDER BY {step}) || ']'"] + [
            f"'[' || string_agg(COALESCE(({values} -> %s)::text, '{_MISSING}'), ',' "
            f"ORDER BY {step}) || ']'"
            for _ in keys
        ]
        key_params = list(keys)
        source = table
    else:  # SQLite (3.38+ for ->): aggregate over a subquery sorted by step
        cols = [f"'[' || group_concat({step}, ',') || ']'"] + [
            f"'[' || group_concat(COALESCE({values} -> %s, '{_MISSING}'), ',') || ']'" for _ in keys
        ]
        key_params = [f'$."{k}"' for k in keys]
        source = f"(SELECT * FROM {table} WHERE {' AND '.join(where)} ORDER BY {run_col}, {step})"
        where = []  # applied inside the subquery
    sql = f"SELECT {run_col}, {', '.join(cols)} FROM {source}"
    if where:
        sql += f" WHERE {' AND '.join(where)}"
    sql += f" GROUP BY {run_col}"
    params = key_params + where_params  # in the order their placeholders appear
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def metric_step_ranges(run_ids: list[int]) -> dict[int, tuple[int, int]]:
    """The first and last stored step of each run that has any (one query)."""
    rows = (
        MetricStep.objects.filter(run_id__in=list(run_ids))
        .values("run_id")
        .annotate(first=Min("step"), last=Max("step"))
        .values_list("run_id", "first", "last")
    )
    return {run_id: (first, last) for run_id, first, last in rows}
