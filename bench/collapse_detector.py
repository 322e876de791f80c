"""Collapse detector on synthetic accuracy series: false alarms and detection delay.

Each series is one simulated run of ``steps`` RL steps at 16 prompts x 8
answers. Two noise models:

* binomial: 128 independent answers a step at the true rate;
* prompt-correlated: each prompt's own rate is drawn from Beta(p c, (1-p) c)
  with c = 0.4, then 8 answers; the step-to-step noise is then about the
  binomial std over the 16 PROMPTS, which is what the runs in docs/results.md
  show (observed 0.046-0.097 at accuracy 0.07-0.25).

Reported: the share of noise-only runs that END flagged (a flag later revoked
by a recovery does not count), and for falls from a level to near zero the
share detected and the median delay from the fall to the step the collapse
became known.

    python -m bench.collapse_detector [--runs 40] [--steps 400]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from bench.common import print_table, write_results
from trainer.analysis.collapse import CollapseDetector
from trainer.config import CollapseConfig

PROMPTS, GROUP = 16, 8


def series(levels: np.ndarray, rng: np.random.Generator, correlated: bool) -> np.ndarray:
    if not correlated:
        return rng.binomial(PROMPTS * GROUP, levels) / (PROMPTS * GROUP)
    c = 0.4
    p = levels[:, None]
    rates = rng.beta(np.maximum(p * c, 1e-6), np.maximum((1 - p) * c, 1e-6), (len(levels), PROMPTS))
    return rng.binomial(GROUP, rates).sum(1) / (PROMPTS * GROUP)


def judge(acc: np.ndarray, cfg: CollapseConfig) -> tuple[bool, int | None]:
    det = CollapseDetector(cfg, samples=PROMPTS * GROUP)
    first_known = None
    for step, value in enumerate(acc):
        if det.update(step, float(value)) and first_known is None:
            first_known = step
    return det.collapsed, first_known if det.collapsed else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    cfg = CollapseConfig()
    rows = []
    for correlated in (False, True):
        noise = "prompt-correlated" if correlated else "binomial"
        for level in (0.05, 0.1, 0.2, 0.4):
            rng = np.random.default_rng(0)
            flagged = sum(
                judge(series(np.full(args.steps, level), rng, correlated), cfg)[0]
                for _ in range(args.runs)
            )
            rows.append([noise, f"noise only at {level}", f"{flagged}/{args.runs}", "-"])
        for level, fall_at in ((0.3, 5), (0.3, 60), (0.08, 40)):
            rng = np.random.default_rng(1)
            levels = np.r_[np.full(fall_at, level), np.full(args.steps - fall_at, 0.005)]
            delays = []
            for _ in range(args.runs):
                collapsed, known = judge(series(levels, rng, correlated), cfg)
                if collapsed and known is not None and known >= fall_at:
                    delays.append(known - fall_at)
            delay = f"{statistics.median(delays):g}" if delays else "-"
            rows.append(
                [noise, f"{level} -> 0.005 at step {fall_at}", f"{len(delays)}/{args.runs}", delay]
            )
    header = ["noise", "series", "runs ending flagged / detected", "median delay (steps)"]
    dict_rows = [dict(zip(header, row, strict=True)) for row in rows]
    print_table(dict_rows, header)
    write_results("collapse_detector", {"rows": dict_rows})


if __name__ == "__main__":
    main()
