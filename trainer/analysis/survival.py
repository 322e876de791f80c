"""Cox models of a study's collapse times (lifelines), as the causal study pre-registers them.

One row per run (``run_table``): its time (the collapse step, or its last step
when it never collapsed: censored), the event, its base (the warm-start seed:
runs of one base share a starting model), and its covariates:

* ``gap10``: the run's routing gap, the mean share of (token, MoE layer) pairs
  whose training and rollout top-k sets differ over its first
  ``GAP_STEPS`` steps (``trainer.analysis.run_record``) (measured before training has moved the policy far),
  in units of 10 percentage points (the R3 paper's gap is about 1 unit);
  0 for a dense model, which has no routing;
* ``r3``: 1 when the run replays the rollout's routing in training;
* ``moe``: 1 for an MoE model.

Models (``primary_model``; the pre-registration in docs/results.md fixes them):

* dose: MoE runs, ``h = h0_base(t) exp(b1 gap10 + b2 gap10 x r3)``, stratified by
  base (each base its own baseline hazard). exp(b1) is the hazard ratio per 10
  points of routing gap without replay; exp(b1 + b2) with R3.
* architecture: MoE against dense at zero gap (no replay), ``exp(b moe)``;
  bases differ between architectures, so the base enters as a cluster
  (robust sandwich errors), not a stratum.

``lead_lag_model`` fits a time-varying Cox model (lifelines'
CoxTimeVaryingFitter) on the MoE runs without replay: the collapse hazard at
step t against the k3 and routing inconsistency of step t - lag, over every
run at risk at t. That compares collapsing and surviving runs at the same
step (time-matched), which a table of signals at collapse steps cannot.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from trainer import metric_keys as K
from trainer.analysis.run_record import RunRecord

GAP_UNIT = 0.10  # hazard ratios are per 10 percentage points of routing gap
LEAD_LAG_STEPS = 5  # the lag of the time-varying covariates
K3_FLOOR = 1e-9  # log10(k3) of a zero-gap run is bounded below here


def run_table(runs: Iterable[RunRecord]):
    """A DataFrame, one row per run (``trainer.analysis.run_record.RunRecord``): its
    cell, seed and base, the covariates and the time and event."""
    import pandas as pd

    records = [
        {
            "variant": run.variant,
            "seed": run.seed,
            "base": run.base,
            "moe": int(run.moe),
            "r3": int(run.r3),
            "gap10": run.gap / GAP_UNIT if run.moe else 0.0,
            "sigma": run.sigma,
            "precision": run.precision,
            "time": float(run.time),
            "event": run.event,
        }
        for run in runs
    ]
    return pd.DataFrame.from_records(records)


def _exp(x: float) -> float:
    """exp that gives inf for a diverged coefficient (complete separation) instead of raising."""
    return math.exp(x) if x < 700 else float("inf")


def _effect(fitter, term: str, combine: tuple[str, ...] = ()) -> dict[str, float]:
    """Hazard ratio with its 95% interval and Wald p for ``term`` (or the sum of
    ``term`` and ``combine``: exp(b1 + b2) with the covariance of the two)."""
    names = (term, *combine)
    coef = float(sum(fitter.params_[n] for n in names))
    if getattr(fitter, "robust", False) or getattr(fitter, "cluster_col", None):
        # A robust (sandwich) fit keeps its errors in standard_errors_ only; its
        # variance_matrix_ is the model-based one (lifelines).
        if combine:
            raise ValueError("a combined effect needs the sandwich covariance: not kept")
        se = float(fitter.standard_errors_[term])
    else:
        # By position: CoxTimeVaryingFitter's variance matrix has no column labels.
        where = [list(fitter.params_.index).index(n) for n in names]
        cov = fitter.variance_matrix_.to_numpy()[np.ix_(where, where)]
        se = float(math.sqrt(max(cov.sum(), 0.0)))
    from scipy import stats

    z = coef / se if se > 0 else float("inf") * np.sign(coef)
    p = float(2 * stats.norm.sf(abs(z))) if se > 0 else 0.0
    return {
        "coef": coef,
        "se": se,
        "hr": _exp(coef),
        "hr_low": _exp(coef - 1.959964 * se),
        "hr_high": _exp(coef + 1.959964 * se),
        "p": p,
    }


def _fit(frame, formula: str, **kwargs):
    from lifelines import CoxPHFitter

    fitter = CoxPHFitter(penalizer=kwargs.pop("penalizer", 0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitter.fit(frame, duration_col="time", event_col="event", formula=formula, **kwargs)
    return fitter


def cox_effect(frame, term: str, cluster: str | None = None) -> dict[str, float]:
    """One covariate's hazard ratio (``_effect``) from a Cox model of ``frame``'s time
    and event on ``term`` alone, one baseline hazard, with robust (sandwich) errors
    clustered by ``cluster`` when given (lifelines' ``cluster_col``)."""
    columns = ["time", "event", term, *([cluster] if cluster else [])]
    kwargs = {"cluster_col": cluster} if cluster else {}
    return _effect(_fit(frame[columns], term, **kwargs), term)


def dose_model(frame) -> dict[str, Any] | None:
    """MoE runs: hazard ratio per 10 points of routing gap, without and with R3."""
    moe = frame[frame["moe"] == 1]
    if moe["event"].sum() == 0 or moe["gap10"].nunique() < 2:
        return None
    has_r3 = moe["r3"].nunique() == 2
    formula = "gap10 + gap10:r3" if has_r3 else "gap10"
    fitter = _fit(moe[["time", "event", "gap10", "r3", "base"]], formula, strata=["base"])
    out = {
        "runs": len(moe),
        "events": int(moe["event"].sum()),
        "gap": _effect(fitter, "gap10"),
    }
    if has_r3:
        out["r3_interaction"] = _effect(fitter, "gap10:r3")
        out["gap_with_r3"] = _effect(fitter, "gap10", ("gap10:r3",))
    return out


def architecture_model(frame) -> dict[str, Any] | None:
    """MoE against dense at zero gap (no replay), the base as a cluster."""
    zero = frame[(frame["r3"] == 0) & ((frame["moe"] == 0) | (frame["gap10"] < 0.05))]
    if zero["moe"].nunique() < 2 or zero["event"].sum() == 0:
        return None
    sub = zero[["time", "event", "moe", "base"]].copy()
    sub["cluster"] = sub["moe"].astype(str) + "-" + sub["base"].astype(str)
    fitter = _fit(sub[["time", "event", "moe", "cluster"]], "moe", cluster_col="cluster")
    return {"runs": len(sub), "events": int(sub["event"].sum()), "moe": _effect(fitter, "moe")}


def lead_lag_frame(runs: Iterable[RunRecord], lag: int = LEAD_LAG_STEPS):
    """Long format for CoxTimeVaryingFitter: one row per (run, step) at risk, with
    the k3 (log10) and routing inconsistency of step - lag; the row of the
    collapse step carries the event."""
    import pandas as pd

    records = []
    for i, run in enumerate(runs):
        end = run.time
        by_step = {int(r["step"]): r for r in run.rows}
        for step in range(lag, end + 1):
            past = by_step.get(step - lag)
            if past is None:
                continue
            k3 = past.get(K.MISMATCH_KL_K3)
            ri = past.get(K.MISMATCH_ROUTING_INCONSISTENCY)
            if k3 is None or ri is None:
                continue
            records.append(
                {
                    "id": i,
                    "start": step - 1,
                    "stop": step,
                    "event": int(run.collapsed and step == end),
                    "log10_k3_lag": math.log10(max(k3, K3_FLOOR)),
                    "routing_lag10": ri / GAP_UNIT,
                }
            )
    return pd.DataFrame.from_records(records)


def lead_lag_model(runs: Iterable[RunRecord], lag: int = LEAD_LAG_STEPS):
    """Hazard ratios per decade of lagged k3 and per 10 points of lagged routing gap."""
    from lifelines import CoxTimeVaryingFitter

    frame = lead_lag_frame(runs, lag)
    if frame.empty or frame["event"].sum() == 0:
        return None
    # A covariate that never varies (e.g. the routing gap of a run set at one dose
    # with replay) carries no information and would make the Hessian singular.
    terms = {"k3_per_decade": "log10_k3_lag", "routing_per_10pct": "routing_lag10"}
    varying = {name: col for name, col in terms.items() if frame[col].nunique() > 1}
    if not varying:
        return None
    fitter = CoxTimeVaryingFitter(penalizer=1e-4)
    columns = ["id", "start", "stop", "event", *varying.values()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitter.fit(
            frame[columns], id_col="id", event_col="event", start_col="start", stop_col="stop"
        )
    out: dict[str, Any] = {"lag": lag, "rows": len(frame), "events": int(frame["event"].sum())}
    for name, col in terms.items():
        out[name] = _effect(fitter, col) if name in varying else None
    return out
