"""Server-side downsampling of long metric series that keeps what matters.

A 2,000-step run with ten metrics is 20k points per run; twenty runs on one
compare page would freeze the browser. Averaging or striding the series would
hide exactly what a stability study looks for: a one-step spike of the
training-inference KL or of the gradient norm. Both methods here keep it:

* ``minmax`` (default): split the points into equal-count buckets and keep the
  smallest and the largest value of every bucket, in step order, plus the first
  and the last point. Every local extreme wider than a bucket survives, and the
  drawn envelope is the envelope of the full series.
* ``lttb``: Largest-Triangle-Three-Buckets (Steinarsson 2013, "Downsampling
  Time Series for Visual Representation", MSc thesis, University of Iceland):
  one point per bucket, the one forming the largest triangle with the point
  kept in the previous bucket and the mean of the next bucket. A spike makes a
  large triangle, so it is kept; the line's shape is smoother than minmax.
  Computed by tsdownsample's MinMaxLTTB (LTTB over per-bucket minima and
  maxima, Van Der Donckt et al. 2023).

Missing values (``None`` or NaN, and +-inf, which a chart cannot draw) are
gaps. A run of consecutive missing values is kept as ONE NaN point at its first
step, so the chart breaks the line there instead of bridging it, and the
finite stretches between gaps are downsampled separately with a share of the
point budget proportional to their length.

All functions take plain sequences and return numpy arrays; nothing here knows
about Django.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from tsdownsample import MinMaxLTTBDownsampler

Method = Literal["minmax", "lttb"]
METHODS: tuple[str, ...] = ("minmax", "lttb")

# Stateless, so one instance serves every call.
_MINMAX_LTTB = MinMaxLTTBDownsampler()

# Fewest points a downsampled series may have: first, last, and one extreme pair.
MIN_POINTS = 4


def as_float_array(values: Sequence[float | None] | np.ndarray) -> np.ndarray:
    """Values as float64 with ``None`` turned into NaN. Shape (n,)."""
    if isinstance(values, np.ndarray):
        return values.astype(np.float64, copy=False)
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _sorted_by_step(
    steps: Sequence[int] | np.ndarray, values: Sequence[float | None] | np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps (n,), values (n,) and the order (n,) that sorts them by step (stable)."""
    x = np.asarray(steps)
    y = as_float_array(values)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"steps and values must be 1-D of equal length, got {x.shape}, {y.shape}")
    if x.size > 1 and np.any(np.diff(x) < 0):
        order = np.argsort(x, kind="stable")
    else:
        order = np.arange(x.size)
    return x[order], y[order], order


def _minmax_indices(y: np.ndarray, budget: int) -> np.ndarray:
    """Indices into a finite segment ``y`` (n,) keeping first, last and both extremes
    of every bucket, in index order; at most ``budget`` of them."""
    n = y.size
    if n <= budget:
        return np.arange(n)
    interior = n - 2
    n_buckets = (budget - 2) // 2
    if n_buckets == 0:  # budget 3: first, last and the point farthest from their midpoint
        far = 1 + int(np.argmax(np.abs(y[1 : n - 1] - (y[0] + y[n - 1]) / 2)))
        return np.array([0, far, n - 1], dtype=np.int64)
    # Equal-count buckets over the interior points 1 .. n-2.
    edges = np.linspace(1, n - 1, n_buckets + 1).astype(np.int64)
    idx = np.arange(1, n - 1)
    bucket = np.searchsorted(edges, idx, side="right") - 1
    # Sort by (bucket, value): the first of a bucket is its minimum, the last its maximum.
    order = np.lexsort((y[1 : n - 1], bucket))
    bucket_sorted = bucket[order]
    starts = np.flatnonzero(np.r_[True, bucket_sorted[1:] != bucket_sorted[:-1]])
    ends = np.r_[starts[1:], interior] - 1
    lows = idx[order[starts]]
    highs = idx[order[ends]]
    keep = np.concatenate(([0], lows, highs, [n - 1]))
    return np.unique(keep)  # sorted, and a bucket whose min is its max counts once


def _lttb_indices(x: np.ndarray, y: np.ndarray, budget: int) -> np.ndarray:
    """Largest-Triangle-Three-Buckets on a finite segment (n,); ``budget`` indices,
    the first and the last included.

    The kernel is tsdownsample's MinMaxLTTB (Rust): LTTB run on the minima and
    maxima of ``4 * budget`` equal-count buckets instead of on every point, which
    keeps LTTB's choice of spikes at a fraction of the cost (docs/benchmarks-archive.md,
    "Downsampling": 8x faster than the pure-Python LTTB loop it replaced).
    """
    n = y.size
    if n <= budget:
        return np.arange(n)
    picked = _MINMAX_LTTB.downsample(np.ascontiguousarray(x), np.ascontiguousarray(y), n_out=budget)
    return picked.astype(np.int64)


def _segments(finite: np.ndarray) -> tuple[list[tuple[int, int]], list[int]]:
    """Finite stretches as [start, stop) pairs and the first index of each gap."""
    change = np.diff(np.r_[0, finite.astype(np.int8), 0])
    starts = np.flatnonzero(change == 1)
    stops = np.flatnonzero(change == -1)
    gap_change = np.diff(np.r_[0, (~finite).astype(np.int8), 0])
    gaps = np.flatnonzero(gap_change == 1)
    return list(zip(starts.tolist(), stops.tolist(), strict=True)), gaps.tolist()


def _split_budget(lengths: list[int], budget: int) -> list[int] | None:
    """Share ``budget`` among segments by length, each at least min(len, 2).

    None when even the minimum does not fit (too many gaps for the budget)."""
    minimum = [min(n, 2) for n in lengths]
    spare = budget - sum(minimum)
    if spare < 0:
        return None
    total = sum(lengths)
    shares = [m + int(spare * n / total) for m, n in zip(minimum, lengths, strict=True)]
    return [min(s, n) for s, n in zip(shares, lengths, strict=True)]


def downsample_indices(
    steps: Sequence[int] | np.ndarray,
    values: Sequence[float | None] | np.ndarray,
    max_points: int,
    method: Method = "minmax",
) -> np.ndarray:
    """Indices into the inputs of the points to draw, in step order; at most ``max_points``.

    steps, values: (n,). Missing values (None, NaN, +-inf) are gaps; each run of
    them contributes one index (its first point) so the line breaks there.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if max_points < MIN_POINTS:
        raise ValueError(f"max_points must be at least {MIN_POINTS}, got {max_points}")
    x, y, order = _sorted_by_step(steps, values)
    n = y.size
    if n <= max_points:
        return order
    finite = np.isfinite(y)
    segments, gaps = _segments(finite)
    lengths = [stop - start for start, stop in segments]
    shares = _split_budget(lengths, max_points - len(gaps))
    if shares is None:
        # Gaps denser than the budget: they cannot all be drawn at this
        # resolution, so draw the finite points' extremes as if the gaps were
        # not there (zooming in fetches full resolution and shows them).
        finite_idx = np.flatnonzero(finite)
        picked = _pick(x[finite_idx], y[finite_idx], max_points, method)
        return order[finite_idx[picked]]
    kept = [np.asarray(gaps, dtype=np.int64)]
    for (start, stop), share in zip(segments, shares, strict=True):
        kept.append(start + _pick(x[start:stop], y[start:stop], share, method))
    return order[np.sort(np.concatenate(kept))]


def _pick(x: np.ndarray, y: np.ndarray, budget: int, method: Method) -> np.ndarray:
    if budget >= y.size:
        return np.arange(y.size)
    if budget <= 2:
        return np.array([0, y.size - 1][:budget], dtype=np.int64)
    if method == "lttb":
        return _lttb_indices(x, y, budget)
    return _minmax_indices(y, budget)


def downsample(
    steps: Sequence[int] | np.ndarray,
    values: Sequence[float | None] | np.ndarray,
    max_points: int,
    method: Method = "minmax",
) -> tuple[np.ndarray, np.ndarray]:
    """Downsampled (steps, values), each (m,) with m <= max_points, steps non-decreasing.

    Missing values come back as NaN at the first step of each gap.
    """
    idx = downsample_indices(steps, values, max_points, method)
    y = as_float_array(values)[idx]
    return np.asarray(steps)[idx], np.where(np.isfinite(y), y, np.nan)


def downsample_many(
    series: Sequence[tuple[Sequence[int] | np.ndarray, Sequence[float | None] | np.ndarray]],
    max_points: int,
    method: Method = "minmax",
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``downsample`` of many series at once, with the same result for each.

    ``minmax`` is vectorised across series: the buckets of every long finite
    stretch of every series are laid end to end in one array, and their
    minima and maxima come from one ``np.minimum.reduceat`` /
    ``np.maximum.reduceat`` pass instead of a sort per series (a compare page
    downsamples 20 runs x 10+ metrics per request). Ties pick the same points
    as ``downsample`` (the first minimum, the last maximum of a bucket).
    """
    if method != "minmax":
        return [downsample(x, y, max_points, method) for x, y in series]
    if max_points < MIN_POINTS:
        raise ValueError(f"max_points must be at least {MIN_POINTS}, got {max_points}")
    plans = []  # per series: sorted x, y, kept index arrays, deferred segments
    jobs: list[tuple[np.ndarray, np.ndarray]] = []  # (interior values, bucket starts in it)
    for steps, values in series:
        x, y, _ = _sorted_by_step(steps, values)
        if y.size <= max_points:
            plans.append((x, y, [np.arange(y.size)], []))
            continue
        finite = np.isfinite(y)
        if finite.all():  # the common case: one finite stretch
            segments, gaps, shares = [(0, y.size)], [], [max_points]
        else:
            segments, gaps = _segments(finite)
            lengths = [stop - start for start, stop in segments]
            shares = _split_budget(lengths, max_points - len(gaps))
        if shares is None:  # gaps denser than the budget: as downsample_indices does
            finite_idx = np.flatnonzero(finite)
            picked = _pick(x[finite_idx], y[finite_idx], max_points, method)
            plans.append((x, y, [finite_idx[picked]], []))
            continue
        kept, deferred = [np.asarray(gaps, dtype=np.int64)], []
        for (start, stop), share in zip(segments, shares, strict=True):
            n = stop - start
            if share >= n or share <= 3:
                kept.append(start + _pick(x[start:stop], y[start:stop], share, method))
                continue
            deferred.append((start, n, len(jobs)))
            jobs.append((y[start + 1 : stop - 1], (share - 2) // 2))
        plans.append((x, y, kept, deferred))
    extremes = _bucket_extremes(jobs)
    out = []
    for x, y, kept, deferred in plans:
        for start, n, job in deferred:
            kept.append(start + np.concatenate(([0], extremes[job] + 1, [n - 1])))
        idx = np.sort(np.concatenate(kept)) if len(kept) > 1 else kept[0]
        values = y[idx]
        out.append((x[idx], np.where(np.isfinite(values), values, np.nan)))
    return out


def window_downsample_many(
    series: Sequence[tuple[Sequence[int] | np.ndarray, Sequence[float | None] | np.ndarray]],
    max_points: int,
    start: float | None = None,
    end: float | None = None,
    method: Method = "minmax",
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``window_downsample`` of many series at once (see ``downsample_many``)."""
    return downsample_many([select_window(x, y, start, end) for x, y in series], max_points, method)


def _bucket_extremes(jobs: list[tuple[np.ndarray, int]]) -> list[np.ndarray]:
    """For each (interior values (n,), number of buckets b): the sorted, distinct
    indices of the first minimum and the last maximum of each of the b
    equal-count buckets of ``_minmax_indices``; all jobs in one vectorised pass."""
    if not jobs:
        return []
    lengths = np.array([v.size for v, _ in jobs], dtype=np.int64)
    n_buckets = np.array([b for _, b in jobs], dtype=np.int64)
    offsets = np.r_[0, np.cumsum(lengths)[:-1]]
    values = np.concatenate([v for v, _ in jobs])
    # Bucket starts as np.linspace(1, n + 1, b + 1) computes them (k * step + 1,
    # truncated), shifted to the interior and to the job's offset.
    k = np.arange(n_buckets.sum()) - np.repeat(np.r_[0, np.cumsum(n_buckets)[:-1]], n_buckets)
    step = np.repeat(lengths / n_buckets, n_buckets)
    starts = (k * step + 1).astype(np.int64) - 1 + np.repeat(offsets, n_buckets)
    bucket = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, values.size]))
    lows = _first_hit(values == np.minimum.reduceat(values, starts)[bucket], bucket, first=True)
    highs = _first_hit(values == np.maximum.reduceat(values, starts)[bucket], bucket, first=False)
    # Both extremes of a bucket lie inside it, so (smaller, larger) pairs are in
    # order; a bucket whose min is its max counts once.
    pairs = np.column_stack((np.minimum(lows, highs), np.maximum(lows, highs)))
    keep = np.column_stack((np.ones(lows.size, dtype=bool), lows != highs))
    out, b0 = [], 0
    for offset, nb in zip(offsets.tolist(), n_buckets.tolist(), strict=True):
        out.append(pairs[b0 : b0 + nb][keep[b0 : b0 + nb]] - offset)
        b0 += nb
    return out


def _first_hit(hit: np.ndarray, bucket: np.ndarray, *, first: bool) -> np.ndarray:
    """Per bucket (every bucket has a hit), the first (or last) position where hit is true."""
    pos = np.flatnonzero(hit)
    owner = bucket[pos]
    change = owner[1:] != owner[:-1]
    return pos[np.r_[True, change]] if first else pos[np.r_[change, True]]


def select_window(
    steps: Sequence[int] | np.ndarray,
    values: Sequence[float | None] | np.ndarray,
    start: float | None = None,
    end: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Points with start <= step <= end, plus one neighbour outside each edge.

    The neighbours let the line run to the edges of a zoomed chart instead of
    stopping at the first point inside it. Inputs (n,), sorted by step.
    """
    x, y, _ = _sorted_by_step(steps, values)
    lo = 0 if start is None else max(int(np.searchsorted(x, start, side="left")) - 1, 0)
    hi = x.size if end is None else min(int(np.searchsorted(x, end, side="right")) + 1, x.size)
    return x[lo:hi], y[lo:hi]


def window_downsample(
    steps: Sequence[int] | np.ndarray,
    values: Sequence[float | None] | np.ndarray,
    max_points: int,
    start: float | None = None,
    end: float | None = None,
    method: Method = "minmax",
) -> tuple[np.ndarray, np.ndarray]:
    """The visible window, at full resolution when it fits in ``max_points``."""
    x, y = select_window(steps, values, start, end)
    return downsample(x, y, max_points, method)


def bin_columns(
    steps: Sequence[int] | np.ndarray, matrix: np.ndarray, max_columns: int
) -> tuple[np.ndarray, np.ndarray]:
    """Average a (rows, n) matrix over equal-count column buckets -> (rows, m), m <= max_columns.

    For expert-load heatmaps: a bucket's mean load is still a distribution over
    experts (columns sum to one), which a per-bucket max would not be. Each
    bucket is labelled by its first step.
    """
    x = np.asarray(steps)
    z = np.asarray(matrix, dtype=np.float64)
    if z.ndim != 2 or z.shape[1] != x.size:
        raise ValueError(f"matrix must be (rows, {x.size}), got {z.shape}")
    if x.size <= max_columns:
        return x, z
    edges = np.linspace(0, x.size, max_columns + 1).astype(np.int64)
    starts = np.unique(edges[:-1])
    with np.errstate(invalid="ignore"):
        sums = np.add.reduceat(np.nan_to_num(z), starts, axis=1)
        present = np.add.reduceat(np.isfinite(z).astype(np.float64), starts, axis=1)
        means = np.where(present > 0, sums / np.maximum(present, 1), np.nan)
    return x[starts], means
