"""Power of a study's primary test, by simulation (the pre-registration's number).

The model simulated is the one the analysis fits (``trainer.analysis.survival``):
each run's collapse hazard is constant in time and proportional over runs,

    h_i(t) = h0 * exp(beta * dose_i),  h0 = -log(1 - p0) / horizon,

so a zero-dose run collapses before ``horizon`` steps with probability p0, and
``exp(beta)`` is the hazard ratio per unit of dose (per 10 percentage points
of routing inconsistency in the causal study). Runs still alive at
``horizon`` are censored there, as a study's runs end at their last step.
Bases differ: each base multiplies the hazard of its runs by a gamma frailty
of mean 1 and variance ``frailty_var`` (0 = identical bases), and the fit
either stratifies by base (``model="strata"``, the causal study's) or keeps
one baseline hazard with robust errors clustered by base
(``model="cluster"``, the near-edge study's), as the analysis does.

Power = the share of simulated studies whose Cox fit gives a dose coefficient
with a two-sided Wald p below ``alpha`` AND a positive estimate (the
hypothesis is a rise). ``smallest_detectable_hr`` scans hazard ratios upward
and returns the first with power >= ``target``.

    python -m trainer.analysis.power --doses 0,0.5,1.2,2.5 --runs 12 --bases 4 --p0 0.15
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Design:
    """The primary comparison: ``runs_per_cell`` runs at each dose, spread evenly
    over ``bases`` bases; collapse before ``horizon`` at dose 0 with probability p0."""

    doses: tuple[float, ...]
    runs_per_cell: int
    bases: int
    p0: float
    horizon: int = 150
    frailty_var: float = 0.0
    model: str = "strata"  # "strata": stratified by base; "cluster": robust errors by base


def simulate_study(design: Design, hazard_ratio: float, rng: np.random.Generator):
    """One simulated study: arrays (time, event, dose, base), one entry per run."""
    beta = math.log(hazard_ratio)
    h0 = -math.log(1.0 - design.p0) / design.horizon
    if design.frailty_var > 0:
        k = 1.0 / design.frailty_var
        frailty = rng.gamma(k, 1.0 / k, size=design.bases)
    else:
        frailty = np.ones(design.bases)
    dose = np.repeat(np.asarray(design.doses, dtype=float), design.runs_per_cell)
    base = np.tile(np.arange(design.runs_per_cell) % design.bases, len(design.doses))
    rate = h0 * np.exp(beta * dose) * frailty[base]
    t = rng.exponential(1.0 / rate)
    event = t < design.horizon
    # Steps are integers: a collapse is dated to the step it happens in (>= 1).
    time = np.where(event, np.maximum(np.ceil(t), 1.0), float(design.horizon))
    return time, event, dose, base


def dose_test(time, event, dose, base, model: str = "strata") -> tuple[float, float]:
    """(coefficient, two-sided Wald p) of the dose in a Cox model stratified by base
    (``model="strata"``) or with robust sandwich errors clustered by base
    (``model="cluster"``).

    No events at all: (0, 1) (nothing to test). lifelines' Newton-Raphson with a
    small ridge (penalizer 1e-4) so a cell without events does not diverge."""
    import pandas as pd
    from lifelines import CoxPHFitter

    if not np.any(event):
        return 0.0, 1.0
    frame = pd.DataFrame({"time": time, "event": event.astype(int), "dose": dose, "base": base})
    if model not in ("strata", "cluster"):
        raise ValueError(f"model must be 'strata' or 'cluster', not {model!r}")
    fitter = CoxPHFitter(penalizer=1e-4)
    grouping = {"strata": ["base"]} if model == "strata" else {"cluster_col": "base"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitter.fit(frame, duration_col="time", event_col="event", **grouping)
    return float(fitter.params_["dose"]), float(fitter.summary.loc["dose", "p"])


def power(
    design: Design, hazard_ratio: float, sims: int = 400, alpha: float = 0.05, seed: int = 0
) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        coef, p = dose_test(*simulate_study(design, hazard_ratio, rng), model=design.model)
        hits += p < alpha and coef > 0
    return hits / sims


def smallest_detectable_hr(
    design: Design,
    ratios: Sequence[float] = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0),
    target: float = 0.8,
    sims: int = 400,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float | None, dict[float, float]]:
    """The smallest hazard ratio in ``ratios`` with power >= target, and every power computed."""
    curve: dict[float, float] = {}
    for hr in ratios:
        curve[hr] = power(design, hr, sims=sims, alpha=alpha, seed=seed)
        if curve[hr] >= target:
            return hr, curve
    return None, curve


def detectable_hazard_ratio(
    events: int, covariate_sd: float, alpha: float = 0.05, power: float = 0.8
) -> float | None:
    """The smallest hazard ratio per unit of a continuous covariate that a Cox test
    detects with ``power`` at two-sided ``alpha``, given ``events`` observed events
    and the covariate's standard deviation (Hsieh & Lavori 2000, after Schoenfeld
    1983): D = (z_{1-alpha/2} + z_power)^2 / (sd^2 log(HR)^2), solved for HR.
    None without events or without spread of the covariate."""
    from statistics import NormalDist

    if events <= 0 or covariate_sd <= 0:
        return None
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return math.exp(z / (covariate_sd * math.sqrt(events)))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--doses", default="0,0.5,1.2,2.5", help="dose of each cell")
    parser.add_argument("--runs", type=int, default=12, help="runs per cell")
    parser.add_argument("--bases", type=int, default=4)
    parser.add_argument("--p0", type=float, default=0.15, help="event rate at dose 0")
    parser.add_argument("--horizon", type=int, default=150)
    parser.add_argument("--frailty-var", type=float, default=0.0)
    parser.add_argument(
        "--model",
        choices=("strata", "cluster"),
        default="strata",
        help="the fit: stratified by base, or robust errors clustered by base",
    )
    parser.add_argument("--sims", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    design = Design(
        doses=tuple(float(d) for d in args.doses.split(",")),
        runs_per_cell=args.runs,
        bases=args.bases,
        p0=args.p0,
        horizon=args.horizon,
        frailty_var=args.frailty_var,
        model=args.model,
    )
    hr, curve = smallest_detectable_hr(design, sims=args.sims, seed=args.seed)
    for ratio, value in curve.items():
        print(f"HR {ratio:>5}: power {value:.3f}")
    print(f"smallest HR with 80% power: {hr}")


if __name__ == "__main__":
    main()
