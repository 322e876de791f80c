"""The collapse detector's error rates in a study's regime, by simulation.

The causal study's endpoint is the step the collapse detector
(``trainer.analysis.collapse``, with the run's ``run.collapse`` settings) dates. Its
two errors, measured here on synthetic runs shaped like the study's:

* false positives: noise-only runs (a constant true accuracy, as a run at
  lr 0 has) that END flagged (a flag later revoked does not count, as the
  study's rejudging does not count it);
* delay: for a collapse injected at a known step (the true accuracy falls
  from its level to ``fall_to`` x the level over ``fall_steps`` steps), the
  steps from the start of the fall to the step the collapse became known;
  and the share of injected collapses found at all.

Batch accuracy is ``prompts`` prompts x ``group`` answers a step with
prompt-correlated noise (each prompt's own rate from Beta(p c, (1 - p) c),
c = 0.4: the step noise the runs in docs/results.md show); held-out accuracy
is a greedy pass over ``eval_samples`` fixed problems every ``eval_every``
steps (binomial at the true level: greedy answers are deterministic given
the model, but which problems the model gets right is what the level sets).

    python -m trainer.analysis.detector_error --levels 0.2,0.3,0.4 --runs 400

The same two errors on real runs (``--real DIR``: every finished run folder under
a study folder): the detector's verdict on each run as it is, and a collapse
injected into each run's own metrics at a random step in [30, steps - 40] (from
there every correct answer, in the batch and on the held-out set, is kept with
a probability falling from 1 to ``fall_to`` over ``fall_steps`` steps: binomial
thinning of the run's real, noisy counts).

    python -m trainer.analysis.detector_error --real docs/results/causal/runs
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer import metric_keys as K
from trainer.analysis.collapse import CollapseDetector
from trainer.config import CollapseConfig, ExperimentConfig
from trainer.run_folder.files import CONFIG_FILE, read_metrics, run_succeeded

PROMPT_CONCENTRATION = 0.4


@dataclass(frozen=True)
class Regime:
    steps: int = 150
    prompts: int = 16
    group: int = 8
    eval_every: int = 10
    eval_samples: int = 128


def batch_series(levels: np.ndarray, regime: Regime, rng: np.random.Generator) -> np.ndarray:
    """Per-step batch accuracy (steps,) around the true ``levels`` (steps,)."""
    p = np.clip(levels[:, None], 1e-6, 1 - 1e-6)
    c = PROMPT_CONCENTRATION
    rates = rng.beta(p * c, (1 - p) * c, (len(levels), regime.prompts))
    return rng.binomial(regime.group, rates).sum(1) / (regime.prompts * regime.group)


def judge(
    levels: np.ndarray, regime: Regime, cfg: CollapseConfig, rng: np.random.Generator
) -> tuple[bool, int | None, int | None]:
    """(ends collapsed, the step the collapse first became known, the step it is
    dated to) for one simulated run."""
    batch = batch_series(levels, regime, rng)

    def held_out(step: int) -> float | None:
        if step % regime.eval_every:
            return None
        return float(rng.binomial(regime.eval_samples, levels[step]) / regime.eval_samples)

    det = CollapseDetector(
        cfg, samples=regime.prompts * regime.group, eval_samples=regime.eval_samples
    )
    return _detect(det, regime.steps, held_out, lambda step: float(batch[step]))


def _detect(
    det: CollapseDetector,
    steps: int,
    held_out: Callable[[int], float | None],
    batch: Callable[[int], float],
) -> tuple[bool, int | None, int | None]:
    """Feed ``det`` step by step as the runner does (the held-out accuracy of a step,
    when it has one, before its batch accuracy): (ends collapsed, the step the
    standing collapse first became known, the step it is dated to)."""
    known = None
    for step in range(steps):
        if (accuracy := held_out(step)) is not None:
            det.update_eval(step, accuracy)
        if det.update(step, batch(step)) and known is None:
            known = step
        if not det.collapsed:
            known = None  # revoked: the next flag is a new detection
    if not det.collapsed:
        return False, None, None
    return True, known, det.collapse_step


def _delays(delays: list[int], dating: list[int], runs: int) -> dict[str, float | None]:
    """The share of injected collapses found, the delay until known (median, 90th
    percentile) and the median dating error (dated step minus the fall's start)."""
    return {
        "found": len(delays) / runs if runs else None,
        "median_delay": statistics.median(delays) if delays else None,
        "p90_delay": float(np.percentile(delays, 90)) if delays else None,
        "median_dating_error": statistics.median(dating) if dating else None,
    }


def false_positive_rate(
    level: float, regime: Regime, cfg: CollapseConfig, runs: int, seed: int = 0
) -> float:
    rng = np.random.default_rng(seed)
    levels = np.full(regime.steps, level)
    return sum(judge(levels, regime, cfg, rng)[0] for _ in range(runs)) / runs


def injected(
    level: float,
    regime: Regime,
    cfg: CollapseConfig,
    runs: int,
    fall_to: float = 0.2,
    fall_steps: int = 10,
    seed: int = 1,
) -> dict[str, float | None]:
    """Collapses injected at a random step in [30, steps - 40]: the share found, the
    delay until known (median, 90th percentile) and the dating error (the dated
    step minus the step the fall began: the endpoint's own error)."""
    rng = np.random.default_rng(seed)
    delays, dating = [], []
    for _ in range(runs):
        start = int(rng.integers(30, regime.steps - 40))
        ramp = np.linspace(level, level * fall_to, fall_steps)
        levels = np.full(regime.steps, level * fall_to)
        levels[:start] = level
        levels[start : start + fall_steps] = ramp[: regime.steps - start]
        collapsed, known, dated = judge(levels, regime, cfg, rng)
        if collapsed and known is not None and known >= start:
            delays.append(known - start)
            dating.append(dated - start)
    return {
        **_delays(delays, dating, runs),
        "median_abs_dating_error": statistics.median(abs(d) for d in dating) if dating else None,
    }


@dataclass(frozen=True)
class RealRun:
    """One finished run's detector inputs: batch accuracy per step (steps,), held-out
    accuracy at its evaluation steps, and the sample sizes behind each."""

    name: str
    batch: np.ndarray
    evals: dict[int, float]
    samples: int
    eval_samples: int
    cfg: CollapseConfig


def read_real_runs(study_dir: Path) -> list[RealRun]:
    """Every finished run folder under ``study_dir`` (``<variant>/seed<k>``)."""
    runs = []
    for run_dir in sorted(p.parent for p in study_dir.glob(f"*/seed*/{CONFIG_FILE}")):
        if not run_succeeded(run_dir):
            continue
        cfg = ExperimentConfig.model_validate(json.loads((run_dir / CONFIG_FILE).read_text()))
        rows = read_metrics(run_dir)
        runs.append(
            RealRun(
                name=f"{run_dir.parent.name}/{run_dir.name}",
                batch=np.array([r[K.REWARD_ACCURACY] for r in rows], dtype=float),
                evals={r["step"]: r[K.EVAL_ACCURACY] for r in rows if K.EVAL_ACCURACY in r},
                samples=cfg.rollout.prompts_per_step * cfg.rollout.group_size,
                eval_samples=cfg.task.eval_size,
                cfg=cfg.run.collapse,
            )
        )
    return runs


def judge_real(
    run: RealRun, keep: np.ndarray | None = None, rng: np.random.Generator | None = None
) -> tuple[bool, int | None, int | None]:
    """The detector over a real run's series, as the run fed it: (ends collapsed, the
    step the collapse became known, its dated step). ``keep`` (steps,): the share of
    correct answers kept at each step (binomial thinning with ``rng``)."""

    def thinned(accuracy: float, n: int, step: int) -> float:
        if keep is None or keep[step] >= 1.0:
            return accuracy
        return rng.binomial(round(accuracy * n), keep[step]) / n

    def held_out(step: int) -> float | None:
        if step not in run.evals:
            return None
        return thinned(run.evals[step], run.eval_samples, step)

    det = CollapseDetector(run.cfg, samples=run.samples, eval_samples=run.eval_samples)
    return _detect(
        det,
        len(run.batch),
        held_out,
        lambda step: thinned(float(run.batch[step]), run.samples, step),
    )


def real_runs_error(
    runs: Sequence[RealRun], fall_to: float = 0.2, fall_steps: int = 10, seed: int = 1
) -> dict[str, float | int | None]:
    """On real runs: how many end flagged as they are (each a false positive if the run
    did not collapse, which the caller knows), and for a collapse injected into
    each: the share found, the delay until known and the dating error."""
    rng = np.random.default_rng(seed)
    flagged, delays, dating = [], [], []
    for run in runs:
        if judge_real(run)[0]:
            flagged.append(run.name)
        steps = len(run.batch)
        start = int(rng.integers(30, steps - 40))
        keep = np.ones(steps)
        keep[start:] = fall_to
        keep[start : start + fall_steps] = np.linspace(1.0, fall_to, fall_steps)
        collapsed, known, dated = judge_real(run, keep, rng)
        if collapsed and known is not None and known >= start:
            delays.append(known - start)
            dating.append(dated - start)
    injected_delays = _delays(delays, dating, len(runs))
    return {
        "runs": len(runs),
        "flagged_as_they_are": len(flagged),
        "flagged": flagged,
        "injected_found": injected_delays.pop("found"),
        **injected_delays,
    }


def characterise(
    levels: Sequence[float], regime: Regime, cfg: CollapseConfig, runs: int
) -> list[dict]:
    rows = []
    for level in levels:
        rows.append(
            {
                "level": level,
                "false_positive_rate": false_positive_rate(level, regime, cfg, runs),
                **injected(level, regime, cfg, runs),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="0.1,0.2,0.3,0.4")
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--real", type=Path, default=None, help="a study folder of real runs")
    args = parser.parse_args(argv)
    if args.real is not None:
        result = real_runs_error(read_real_runs(args.real))
        print(json.dumps(result, indent=1))
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
        return
    rows = characterise(
        [float(x) for x in args.levels.split(",")], Regime(), CollapseConfig(), args.runs
    )
    for row in rows:
        print(row)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
