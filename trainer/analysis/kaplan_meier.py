"""Survival statistics of time-to-collapse across seeds (docs/design.md 3.6), numpy-free.

A run is one subject: its time is the collapse step if it collapsed (an event)
or its last step if it did not (right-censored: it survived at least that
long). Formulas:

* Kaplan-Meier: S(t) = prod over event times t_i <= t of (1 - d_i / n_i),
  n_i = runs still at risk just before t_i (time >= t_i), d_i = collapses at
  t_i. A run censored at t_i counts as at risk at t_i (the usual convention:
  censoring after the events of the same time). Greenwood's variance:
  Var S(t) = S(t)^2 x sum over t_i <= t of d_i / (n_i (n_i - d_i)).
* Log-rank test of arm A against a reference arm B: at each distinct event
  time of the pooled runs, O_A = d_A, E_A = d x n_A / n and
  V = d (n_A / n) (n_B / n) (n - d) / (n - 1) (hypergeometric variance);
  chi2 = (sum O_A - sum E_A)^2 / sum V with 1 degree of freedom, and its
  survival function P(chi2_1 > x) = erfc(sqrt(x / 2)) (chi2_1 is the square
  of a standard normal).
* Median time-to-collapse: the first t with S(t) <= 0.5 (None when the curve
  never gets there: more than half the runs survived). Its confidence
  interval is the Kaplan-Meier-based interval of Brookmeyer and Crowley
  (1982) with the plain Greenwood standard error (not the log-log
  transform): all t where |S(t) - 0.5| <= z se(S(t)); the lower end is the
  first t with S(t) <= 0.5 + z se, the upper end the first t with
  S(t) < 0.5 - z se (None: not reached, the interval is open above).

Intervals of a mean over runs are ``trainer.analysis.intervals.mean_ci`` (BCa;
the percentile bootstrap under-covers at a handful of runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z_95 = 1.959963984540054  # standard normal 97.5% quantile


@dataclass(frozen=True)
class KMPoint:
    time: int
    survival: float
    at_risk: int
    events: int
    se: float  # Greenwood standard error of survival


def _event_times(times: Sequence[float], events: Sequence[bool]) -> list[float]:
    return sorted({t for t, e in zip(times, events, strict=True) if e})


def kaplan_meier(times: Sequence[float], events: Sequence[bool]) -> list[KMPoint]:
    """The KM curve at each event time (S is 1 before the first), with Greenwood's se."""
    survival, greenwood = 1.0, 0.0
    curve = []
    for t in _event_times(times, events):
        at_risk = sum(1 for u in times if u >= t)
        d = sum(1 for u, e in zip(times, events, strict=True) if e and u == t)
        survival *= 1.0 - d / at_risk
        if at_risk > d:
            greenwood += d / (at_risk * (at_risk - d))
        se = survival * math.sqrt(greenwood) if survival > 0 else 0.0
        curve.append(KMPoint(int(t), survival, at_risk, d, se))
    return curve


def survival_at(curve: list[KMPoint], t: float) -> float:
    """S(t) from a KM curve (a right-continuous step function)."""
    value = 1.0
    for point in curve:
        if point.time > t:
            break
        value = point.survival
    return value


def chi2_1_sf(x: float) -> float:
    """P(chi-square with 1 dof > x) = erfc(sqrt(x / 2))."""
    return math.erfc(math.sqrt(max(x, 0.0) / 2.0))


@dataclass(frozen=True)
class LogRank:
    observed: float  # collapses in arm A
    expected: float  # expected in arm A under equal hazards
    variance: float
    chi2: float
    p_value: float | None  # None when no run collapsed in either arm


def log_rank(
    times_a: Sequence[float],
    events_a: Sequence[bool],
    times_b: Sequence[float],
    events_b: Sequence[bool],
) -> LogRank:
    """Two-sample log-rank test of arm A against arm B (module docstring)."""
    pooled_t = [*times_a, *times_b]
    pooled_e = [*events_a, *events_b]
    observed = expected = variance = 0.0
    for t in _event_times(pooled_t, pooled_e):
        n_a = sum(1 for u in times_a if u >= t)
        n_b = sum(1 for u in times_b if u >= t)
        n = n_a + n_b
        d_a = sum(1 for u, e in zip(times_a, events_a, strict=True) if e and u == t)
        d = d_a + sum(1 for u, e in zip(times_b, events_b, strict=True) if e and u == t)
        observed += d_a
        expected += d * n_a / n
        if n > 1:
            variance += d * (n_a / n) * (n_b / n) * (n - d) / (n - 1)
    if variance <= 0:
        return LogRank(observed, expected, variance, 0.0, None)
    chi2 = (observed - expected) ** 2 / variance
    return LogRank(observed, expected, variance, chi2, chi2_1_sf(chi2))


@dataclass(frozen=True)
class MedianCI:
    median: int | None  # None: not reached (more than half survived)
    low: int | None
    high: int | None  # None: open above


def median_survival(times: Sequence[float], events: Sequence[bool], z: float = Z_95) -> MedianCI:
    """Median time-to-collapse with the Brookmeyer-Crowley KM interval (Greenwood se)."""
    curve = kaplan_meier(times, events)
    median = next((p.time for p in curve if p.survival <= 0.5), None)
    low = next((p.time for p in curve if p.survival <= 0.5 + z * p.se), None)
    high = next((p.time for p in curve if p.survival < 0.5 - z * p.se), None)
    return MedianCI(median, low, high)
