"""A stored study of eight variants, as a worker would leave it: the review's hard
case (many variants, two seeds for most, a routing-gap dose, collapses only at the
largest gaps, runs of ``STEPS`` steps that never collapsed).

Shared by the review's timing benchmark (bench/bench_review.py) and the browser
tests of the review and the run page at eight variants
(tests/e2e/test_review_eight_variants.py). Synthetic: the metrics are smooth
curves, not training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lab.experiments.services import create_experiment
from lab.runs import lifecycle
from lab.runs.metrics.ingest import ingest_metrics
from lab.runs.metrics.seal import seal_metrics
from lab.runs.models import Run, RunStatus
from trainer import metric_keys as mk

STEPS = 60
N_EXPERTS = 8

# (variant label, preset, overrides, seeds, router noise sigma): labels as a sweep
# names its variants, by the dotted names of the fields that vary.
VARIANTS: tuple[tuple[str, str, dict[str, Any], int], ...] = (
    ("rollout.router_noise=0", "moe-grpo", {}, 2),
    ("rollout.router_noise=0.05", "moe-grpo", {"rollout.router_noise": 0.05}, 2),
    ("rollout.router_noise=0.1", "moe-grpo", {"rollout.router_noise": 0.1}, 2),
    ("rollout.router_noise=0.2", "moe-grpo", {"rollout.router_noise": 0.2}, 2),
    ("rollout.router_noise=0.4", "moe-grpo", {"rollout.router_noise": 0.4}, 3),
    (
        "rollout.router_noise=0.2, stabilizers.replay.mode=r3",
        "moe-grpo-r3",
        {"rollout.router_noise": 0.2},
        2,
    ),
    (
        "rollout.router_noise=0.4, stabilizers.replay.mode=r3",
        "moe-grpo-r3",
        {"rollout.router_noise": 0.4},
        2,
    ),
    ("model.n_experts=0", "dense-grpo", {}, 2),
)


def _gap(sigma: float) -> float:
    """The routing gap a router noise of ``sigma`` gives (about 14% at 0.2)."""
    return 0.7 * sigma


def collapse_step(sigma: float, r3: bool, seed: int) -> int | None:
    """Only the two largest doses without replay collapse: a hazard model over
    these runs is degenerate (its fit separates them completely)."""
    if r3 or sigma < 0.2:
        return None
    return 25 + 8 * seed if sigma >= 0.4 else 40 + 6 * seed


def record(
    step: int, *, seed: int, sigma: float, moe: bool, collapse_at: int | None, steps: int = STEPS
) -> dict:
    """One metrics.jsonl line: smooth curves with a per-seed wobble; before a
    collapse the mismatch grows and accuracy falls."""
    wobble = 0.02 * math.sin(step / 5 + seed)
    ramp = 0.0
    if collapse_at is not None and step >= collapse_at - 10:
        ramp = min(1.0, (step - collapse_at + 10) / 10)
    accuracy = min(0.95, 0.3 + 0.5 * step / steps + wobble) * (1 - 0.8 * ramp)
    kl = 1e-3 * (1 + 10 * sigma) * (1 + 0.3 * math.sin(step / 7 + seed)) + 0.02 * ramp
    rec = {
        "step": step,
        mk.REWARD_MEAN: accuracy + 0.05,
        mk.REWARD_ACCURACY: accuracy,
        mk.MISMATCH_KL_K1: kl * 0.9,
        mk.MISMATCH_KL_K3: kl,
        mk.MISMATCH_EXTREME_TOKEN_FRAC: 0.001 + 0.05 * ramp,
        mk.POLICY_GRAD_NORM: 0.5 + 3 * ramp + abs(wobble) * 5,
        mk.POLICY_CLIP_FRAC: 0.01 + 0.1 * ramp,
        mk.RESPONSE_LENGTH_MEAN: 6 + 2 * math.sin(step / 9),
    }
    if step % 10 == 0:
        rec[mk.EVAL_ACCURACY] = accuracy - 0.03
    if moe:
        rec[mk.MISMATCH_ROUTING_INCONSISTENCY] = _gap(sigma) + 0.01 * seed + 0.2 * ramp
        rec[mk.EXPERTS_MAX_VIOLATION] = 0.3 + 0.5 * ramp + abs(wobble)
        rec[mk.EXPERTS_ROUTER_ENTROPY] = 2.0 - 0.6 * ramp
        for layer in range(2):
            raw = [
                1 + 0.3 * math.sin(step / 30 + e + layer) + (2 * ramp if e == 0 else 0)
                for e in range(N_EXPERTS)
            ]
            rec[f"{mk.EXPERTS_LOAD_PREFIX}{layer}"] = [x / sum(raw) for x in raw]
    return rec


def make_study(
    owner,
    name: str = "router noise sweep, eight variants",
    *,
    variants: Sequence[tuple[str, str, dict[str, Any], int]] = VARIANTS,
    seeds: int | None = None,
    steps: int = STEPS,
) -> dict[str, Any]:
    """The experiment and its runs, finished: ``{"experiment", "runs": {variant: [Run]}}``;
    ``seeds`` overrides every variant's seed count, ``steps`` the steps each run ran."""
    experiment = create_experiment(owner=owner, name=name, preset="moe-grpo", tags=["dose"])
    runs: dict[str, list[Run]] = {}
    for label, preset, overrides, variant_seeds in variants:
        sigma = float(overrides.get("rollout.router_noise", 0.0))
        r3, moe = preset.endswith("r3"), preset != "dense-grpo"
        for seed in range(seeds or variant_seeds):
            run = lifecycle.submit_run(
                owner=owner,
                experiment=experiment,
                preset=preset,
                variant=label,
                overrides={**overrides, "run.seed": seed, "run.steps": steps},
            )
            at = collapse_step(sigma, r3, seed)
            ingest_metrics(
                run.pk,
                [
                    record(s, seed=seed, sigma=sigma, moe=moe, collapse_at=at, steps=steps)
                    for s in range(steps)
                ],
            )
            # summary.json's "steps" counts the steps run (0 .. steps - 1)
            summary: dict[str, Any] = {"status": "succeeded", "steps": steps, "collapsed": False}
            if at is not None:
                summary |= {"collapsed": True, "collapse_step": at, "collapse_reason": "fell"}
            Run.objects.filter(pk=run.pk).update(
                status=RunStatus.SUCCEEDED, summary=summary, current_step=steps
            )
            seal_metrics(run.pk)
            runs.setdefault(label, []).append(Run.objects.get(pk=run.pk))
    return {"experiment": experiment, "runs": runs}
