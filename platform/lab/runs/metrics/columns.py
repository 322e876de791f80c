"""A run's stored metrics as columns: the binary layout of ``MetricColumn`` (no ORM here).

Steps are cut into chunks of ``CHUNK_STEPS``. ``encode_columns`` turns one
chunk's step rows into one column per key; ``decode_column`` turns one
column back into the ``(steps, values)`` pair ``runs.metrics.read.RunSeries``
holds, cut to a step window. Both follow the same
rules as the aggregated read of the rows (metrics/read.py ``_present``), so a
sealed chunk reads exactly as its rows do:

- a step whose JSON lacks the key is not in the key's column;
- a scalar key's stored null, or anything but a number under it, is NaN
  (a gap the chart breaks the line at);
- a vector key (``experts/load/L*``) keeps each stored value as it is.

Scalars are little-endian float64 and steps int64, read back with
``np.frombuffer`` (no per-value parsing); vectors are a UTF-8 JSON array.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.metric_keys import is_vector_key

STEP_DTYPE = np.dtype("<i8")
VALUE_DTYPE = np.dtype("<f8")

# Steps per chunk. A training run's unsealed tail (read from rows) is at most
# this long; a run of n steps has n / CHUNK_STEPS column rows per key. 512
# keeps a live comparison's row read small (20 runs x < 512 rows) while a
# 10,000-step run is still only 20 blobs per key.
CHUNK_STEPS = 512


def chunk_of(step: int) -> int:
    """The chunk holding ``step`` (steps are >= 0)."""
    return max(0, int(step)) // CHUNK_STEPS


def first_step(chunk: int) -> int:
    return int(chunk) * CHUNK_STEPS


@dataclass(frozen=True)
class EncodedColumn:
    """``steps``: int64 bytes, or b"" when the key is at every stored step.
    ``values``: float64 bytes (scalar key) or UTF-8 JSON (vector key)."""

    steps: bytes
    values: bytes


def encode_columns(
    rows: Iterable[tuple[int, Mapping[str, Any]]],
) -> tuple[bytes, dict[str, EncodedColumn]]:
    """(every step as int64 bytes, {key: column}) from ``(step, values)`` rows in
    ascending step order (one chunk's). Every key any row holds gets a column."""
    all_steps: list[int] = []
    present: dict[str, list[int]] = {}
    values: dict[str, list[Any]] = {}
    for step, record in rows:
        all_steps.append(int(step))
        for key, value in record.items():
            present.setdefault(key, []).append(int(step))
            values.setdefault(key, []).append(value)
    n = len(all_steps)
    columns = {}
    for key, key_steps in present.items():
        dense = len(key_steps) == n  # steps are unique, so the key is at every step
        steps_blob = b"" if dense else np.asarray(key_steps, dtype=STEP_DTYPE).tobytes()
        if is_vector_key(key):
            blob = json.dumps(values[key], separators=(",", ":")).encode()
        else:
            blob = scalar_array(values[key]).astype(VALUE_DTYPE).tobytes()
        columns[key] = EncodedColumn(steps_blob, blob)
    return np.asarray(all_steps, dtype=STEP_DTYPE).tobytes(), columns


def scalar_array(values: Sequence[Any]) -> np.ndarray:
    """Stored values under a scalar key as float64 (n,): a null, or anything but a
    number (a string, a list), is NaN. The one conversion for the column and
    the row reads (metrics/read.py), so both give the same series."""
    try:
        return np.asarray(values, dtype=np.float64)  # None -> NaN
    except (TypeError, ValueError):
        return np.array(
            [v if isinstance(v, int | float) else math.nan for v in values], dtype=np.float64
        )


def decode_steps(blob: bytes | memoryview) -> np.ndarray:
    """int64 bytes -> (n,) int64 array (a copy: the database's buffer is not kept)."""
    return np.frombuffer(blob, dtype=STEP_DTYPE).astype(np.int64)


def decode_column(
    key: str,
    steps_blob: bytes | memoryview,
    values_blob: bytes | memoryview,
    all_steps: np.ndarray,
    start: int | None = None,
    end: int | None = None,
) -> tuple[np.ndarray, np.ndarray | list]:
    """One column as ``(steps_k, values_k)`` for the steps in ``[start, end]``.

    ``all_steps``: the run's stored steps (n,), ascending, which a column
    stored without steps (the key is at every step) shares.
    """
    steps = all_steps if len(steps_blob) == 0 else decode_steps(steps_blob)
    lo, hi = window_bounds(steps, start, end)
    if is_vector_key(key):
        vectors = json.loads(bytes(values_blob).decode()) if len(values_blob) else []
        return steps[lo:hi], vectors[lo:hi]
    array = np.frombuffer(values_blob, dtype=VALUE_DTYPE)
    return steps[lo:hi], array[lo:hi].astype(np.float64)


def window_bounds(steps: np.ndarray, start: int | None, end: int | None) -> tuple[int, int]:
    """Index range ``[lo, hi)`` of the ascending ``steps`` within ``[start, end]``."""
    lo = 0 if start is None else int(np.searchsorted(steps, start, "left"))
    hi = steps.size if end is None else int(np.searchsorted(steps, end, "right"))
    return lo, hi
