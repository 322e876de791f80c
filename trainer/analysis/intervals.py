"""Confidence intervals and multiplicity: scipy's BCa bootstrap, t intervals, Holm.

The percentile bootstrap covers 70-84% instead of 95% at five runs a cell; BCa
(bias-corrected and accelerated, Efron 1987) and the t interval are the two
the study reports. Holm's step-down (Holm 1979) keeps the family-wise error
rate of the pre-registered tests at alpha.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Student-t interval of the mean; None with fewer than two values."""
    from scipy import stats

    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size < 2:
        return None
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    low, high = stats.t.interval(level, x.size - 1, loc=x.mean(), scale=stats.sem(x))
    return float(low), float(high)


def bca_interval(
    values: Sequence[float], level: float = 0.95, resamples: int = 9999, seed: int = 0
) -> tuple[float, float] | None:
    """BCa bootstrap interval of the mean (scipy.stats.bootstrap); None with fewer
    than three values. A constant sample gives the degenerate interval."""
    from scipy import stats

    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size < 3:
        return None
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    res = stats.bootstrap(
        (x,),
        np.mean,
        confidence_level=level,
        n_resamples=resamples,
        method="BCa",
        random_state=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass(frozen=True)
class MeanInterval:
    """A mean and its interval, with what it rests on: ``method`` "BCa", "t" or
    "none" (one value: no interval) and ``n`` values."""

    mean: float
    low: float
    high: float
    method: str
    n: int


def mean_interval(
    values: Sequence[float | None],
    level: float = 0.95,
    bounds: tuple[float | None, float | None] = (None, None),
) -> MeanInterval | None:
    """The mean of the finite values and its interval: BCa from three values on
    (the t interval where BCa is undefined, e.g. two distinct values), the t
    interval at two, none at one; None without values. ``bounds``: where the
    quantity itself ends (a KL is >= 0); the interval is cut there, since the mean
    of such values cannot lie past them."""
    x = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not x:
        return None
    mean = sum(x) / len(x)
    if len(x) == 1:
        return MeanInterval(mean, mean, mean, "none", 1)
    interval, method = (bca_interval(x, level), "BCa") if len(x) >= 3 else (None, "t")
    if interval is None or not all(math.isfinite(v) for v in interval):
        interval, method = t_interval(x, level), "t"
    low, high = interval
    if bounds[0] is not None:
        low = max(low, bounds[0])
    if bounds[1] is not None:
        high = min(high, bounds[1])
    return MeanInterval(mean, low, high, method, len(x))


def mean_ci(
    values: Sequence[float | None], level: float = 0.95
) -> tuple[float, float, float] | None:
    """(mean, low, high) of ``mean_interval``."""
    found = mean_interval(values, level)
    return None if found is None else (found.mean, found.low, found.high)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order.

    Sorted ascending p_(1) <= ... <= p_(m): adjusted p_(i) = max over j <= i of
    min(1, (m - j + 1) p_(j)). Rejecting where adjusted < alpha is Holm's test.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
