"""Inference that respects a study's design: runs share bases, so bases are clusters.

A study's runs are not independent: every cell's seed k starts from base
k mod B, so the runs of one base share a starting model, and a base that
learns well lifts every cell on it. Plain least squares over runs treats 48
runs on 4 bases as 48 independent draws (the causal study's slope, p = 0.028);
with the base as a cluster the same data say much less. Here, with statsmodels:

* ``linear_effect``: one coefficient of a linear model (e.g. the held-out
  change against the routing gap, with base fixed effects), reported under
  several inferences side by side: plain OLS, base fixed effects, seed fixed
  effects, cluster-robust (CRV1) errors by base, and the wild-cluster
  bootstrap by base.
* ``wild_cluster_bootstrap``: the restricted wild-cluster bootstrap (WCR,
  Cameron, Gelbach and Miller 2008; MacKinnon and Webb 2017): the model is
  refitted without the tested term, each cluster's residuals are multiplied
  by one weight per draw, the full model is refitted on each synthetic
  outcome, and the p-value is the share of bootstrap |t| (CRV1) at least the
  observed |t|. With few clusters Rademacher weights (+-1) give only 2^G
  distinct draws, so the default is Webb's six-point weights
  (+-sqrt(1/2), +-1, +-sqrt(3/2), each 1/6); where the G-cluster weight
  vectors number at most ``ENUMERATE_MAX`` they are enumerated, every one
  once (an exact, seed-free p-value), else ``draws`` are sampled.
* ``paired_contrast``: a cell against the reference on the same seeds (so
  the same bases): the mean paired difference, its t interval, and its
  wild-cluster bootstrap p-value by base (intercept-only model).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

# Webb (2014) six-point weights: mean 0, variance 1, symmetric.
WEBB = (-math.sqrt(1.5), -1.0, -math.sqrt(0.5), math.sqrt(0.5), 1.0, math.sqrt(1.5))
RADEMACHER = (-1.0, 1.0)
WEIGHTS = {"webb": WEBB, "rademacher": RADEMACHER}
ENUMERATE_MAX = 50_000  # weight vectors: enumerate every one up to this many (G <= 6 for Webb)
DEFAULT_DRAWS = 9_999


def _ols(formula: str, data, groups=None):
    import statsmodels.formula.api as smf

    model = smf.ols(formula, data=data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if groups is None:
            return model.fit()
        return model.fit(cov_type="cluster", cov_kwds={"groups": np.asarray(groups)})


def _summary(fit, term: str, df: int | None = None) -> dict[str, float]:
    """Coefficient, standard error, 95% interval and two-sided p of ``term``; with
    ``df`` the interval and p use t(df) (cluster-robust: t(G - 1)), else the fit's own."""
    from scipy import stats

    coef, se = float(fit.params[term]), float(fit.bse[term])
    if df is None:
        low, high = (float(v) for v in fit.conf_int().loc[term])
        p = float(fit.pvalues[term])
    else:
        half = float(stats.t.ppf(0.975, df)) * se
        low, high = coef - half, coef + half
        p = float(2 * stats.t.sf(abs(coef / se), df)) if se > 0 else 0.0
    return {"coef": coef, "se": se, "low": low, "high": high, "p": p}


def weight_vectors(clusters: int, kind: str = "webb", draws: int = DEFAULT_DRAWS, seed: int = 0):
    """(number of vectors, (n, clusters) array of cluster weights, enumerated?)."""
    points = np.asarray(WEIGHTS[kind])
    total = len(points) ** clusters
    if total <= ENUMERATE_MAX:
        grid = np.array(list(itertools.product(points, repeat=clusters)))
        return grid, True
    rng = np.random.default_rng(seed)
    return rng.choice(points, size=(draws, clusters)), False


def crv1_t(exog: np.ndarray, outcomes: np.ndarray, index: np.ndarray, column: int) -> np.ndarray:
    """t statistics of coefficient ``column`` with CRV1 cluster-robust errors, for many
    outcome vectors at once (the bootstrap's inner loop, vectorised).

    exog: (N, K) design; outcomes: (D, N), one outcome per row; index: (N,) cluster
    number of each observation (0..G-1). Var = c (X'X)^-1 (sum_g X_g' e_g e_g' X_g)
    (X'X)^-1 with c = G/(G-1) (N-1)/(N-K), statsmodels' ``cov_type="cluster"``."""
    n, k = exog.shape
    clusters = int(index.max()) + 1
    bread = np.linalg.pinv(exog.T @ exog)
    beta = outcomes @ (bread @ exog.T).T  # (D, K)
    resid = outcomes - beta @ exog.T  # (D, N)
    # a_g = (sum over the cluster's rows of e_i x_i') (X'X)^-1 e_column: (D, G)
    lever = exog @ bread[:, column]  # (N,)
    a = np.zeros((outcomes.shape[0], clusters))
    np.add.at(a.T, index, (resid * lever).T)
    correction = clusters / (clusters - 1) * (n - 1) / (n - k)
    se = np.sqrt(correction * (a**2).sum(axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return beta[:, column] / se


def wild_cluster_bootstrap(
    data,
    formula: str,
    term: str,
    cluster: str,
    kind: str = "webb",
    draws: int = DEFAULT_DRAWS,
    seed: int = 0,
) -> dict[str, Any]:
    """Restricted wild-cluster bootstrap p-value of H0: ``term`` = 0 in ``formula``
    (OLS; the intercept is ``Intercept``), clusters ``cluster`` (module docstring)."""
    import statsmodels.formula.api as smf

    model = smf.ols(formula, data=data)
    exog = np.asarray(model.exog, dtype=float)
    outcome = np.asarray(model.endog, dtype=float)
    column = list(model.exog_names).index(term)
    labels, index = np.unique(data[cluster].to_numpy(), return_inverse=True)
    t_obs = float(crv1_t(exog, outcome[None, :], index, column)[0])
    # The model under H0: the same design without the tested column.
    restricted = np.delete(exog, column, axis=1)
    if restricted.shape[1]:
        fitted = restricted @ np.linalg.lstsq(restricted, outcome, rcond=None)[0]
    else:
        fitted = np.zeros_like(outcome)
    resid = outcome - fitted
    vectors, enumerated = weight_vectors(len(labels), kind, draws, seed)
    t_star = np.concatenate(
        [
            crv1_t(exog, fitted + chunk[:, index] * resid, index, column)
            for chunk in np.array_split(vectors, max(1, len(vectors) // 4096))
        ]
    )
    exceed = int(np.sum(np.abs(t_star) >= abs(t_obs) - 1e-12))
    return {
        "t": t_obs,
        "p": exceed / len(vectors),
        "draws": len(vectors),
        "enumerated": enumerated,
        "weights": kind,
        "clusters": len(labels),
    }


def linear_effect(
    data, outcome: str, term: str, base: str = "base", seed: str = "seed", **bootstrap
) -> dict[str, Any]:
    """``term``'s coefficient on ``outcome`` under five inferences (module docstring):
    ``ols`` (independence), ``base_fe`` and ``seed_fe`` (fixed effects, OLS errors),
    ``cluster_base`` (no fixed effects, CRV1 errors by base, t(G - 1)),
    ``base_fe_cluster`` (base fixed effects, CRV1 by base), and ``wild_cluster``
    (the bootstrap p of the base fixed-effects model, clusters = bases)."""
    groups = data[base].to_numpy()
    clusters = len(np.unique(groups))
    plain = f"{outcome} ~ {term}"
    fixed = f"{outcome} ~ {term} + C({base})"
    out = {
        "runs": len(data),
        "bases": clusters,
        "ols": _summary(_ols(plain, data), term),
        "base_fe": _summary(_ols(fixed, data), term),
        "seed_fe": _summary(_ols(f"{outcome} ~ {term} + C({seed})", data), term),
        "cluster_base": _summary(_ols(plain, data, groups), term, df=clusters - 1),
        "base_fe_cluster": _summary(_ols(fixed, data, groups), term, df=clusters - 1),
    }
    out["wild_cluster"] = wild_cluster_bootstrap(data, fixed, term, base, **bootstrap)
    return out


def paired_contrast(
    diffs: Sequence[float], bases: Sequence[int], **bootstrap
) -> dict[str, Any] | None:
    """Per-seed differences (cell minus reference, same seed and base) -> their mean,
    t interval (independence) and the wild-cluster bootstrap p by base."""
    import pandas as pd

    from trainer.analysis.intervals import t_interval

    if len(diffs) < 2:
        return None
    frame = pd.DataFrame({"diff": list(diffs), "base": list(bases)})
    out: dict[str, Any] = {
        "pairs": len(frame),
        "bases": int(frame["base"].nunique()),
        "mean": float(frame["diff"].mean()),
        "t": t_interval(list(diffs)),
    }
    if out["bases"] >= 2:
        cluster = _summary(_ols("diff ~ 1", frame, frame["base"]), "Intercept", out["bases"] - 1)
        out["cluster_base"] = cluster
        out["wild_cluster"] = wild_cluster_bootstrap(
            frame, "diff ~ 1", "Intercept", "base", **bootstrap
        )
        out["bases_positive"] = int((frame.groupby("base")["diff"].mean() > 0).sum())
    return out
