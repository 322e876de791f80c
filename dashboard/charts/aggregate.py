"""Aggregate a variant's seeds into one mean line and a band.

Seeds of a variant may log at different steps (a seed that crashed stops
early; downsampled series keep different points), so each seed is put on the
union of all their steps by linear interpolation inside its own step range,
and counts as missing outside it. The mean and band at a step are over the
seeds present there, and ``count`` says how many that is.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dashboard.charts.downsample import as_float_array

Series = tuple[Sequence[int] | np.ndarray, Sequence[float | None] | np.ndarray]
Band = Literal["minmax", "std"]


@dataclass(frozen=True)
class SeedAggregate:
    """Arrays of shape (n,) over the union of the seeds' steps."""

    steps: np.ndarray
    mean: np.ndarray
    lower: np.ndarray  # min over seeds, or mean - std
    upper: np.ndarray  # max over seeds, or mean + std
    count: np.ndarray  # seeds present at each step


def on_grid(series: Series, grid: np.ndarray) -> np.ndarray:
    """One seed's values on ``grid`` (n,): interpolated between its finite points,
    NaN outside its first..last finite step."""
    x = np.asarray(series[0], dtype=np.float64)
    y = as_float_array(series[1])
    finite = np.isfinite(y)
    x, y = x[finite], y[finite]
    out = np.full(grid.shape, np.nan)
    if x.size == 0:
        return out
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    inside = (grid >= x[0]) & (grid <= x[-1])
    out[inside] = np.interp(grid[inside], x, y)
    return out


def aggregate_seeds(seeds: Sequence[Series], band: Band = "minmax") -> SeedAggregate:
    """Mean and band over seeds. ``band``: "minmax" (range of seeds) or "std"
    (mean +- sample standard deviation, ddof=1; zero width where one seed)."""
    if band not in ("minmax", "std"):
        raise ValueError(f"band must be 'minmax' or 'std', got {band!r}")
    if not seeds:
        empty = np.array([], dtype=np.float64)
        return SeedAggregate(np.array([], dtype=np.int64), empty, empty, empty, empty)
    grid = np.unique(np.concatenate([np.asarray(s[0]) for s in seeds]))
    stacked = np.vstack([on_grid(s, grid.astype(np.float64)) for s in seeds])  # (seeds, n)
    count = np.isfinite(stacked).sum(axis=0)
    present = count > 0
    mean = np.full(grid.shape, np.nan)
    lower = np.full(grid.shape, np.nan)
    upper = np.full(grid.shape, np.nan)
    cols = stacked[:, present]
    mean[present] = np.nanmean(cols, axis=0)
    if band == "minmax":
        lower[present] = np.nanmin(cols, axis=0)
        upper[present] = np.nanmax(cols, axis=0)
    else:
        with warnings.catch_warnings():  # one seed: ddof=1 has no degrees of freedom
            warnings.simplefilter("ignore", RuntimeWarning)
            std = np.where(count[present] > 1, np.nanstd(cols, axis=0, ddof=1), 0.0)
        lower[present] = mean[present] - std
        upper[present] = mean[present] + std
    return SeedAggregate(grid, mean, lower, upper, count)
