"""Collapse detection (docs/design.md 3.6, "collapse definition"), resumable.

A run collapses at the first step where either

(a) the loss or a gradient is not finite (``update(..., finite=False)``), or
(b) the batch reward/accuracy, smoothed by a running MEDIAN of the last
    ``window`` steps (m_t), falls below

        threshold = min(drop_fraction x best,  best - margin)

    for ``patience`` consecutive steps, where ``best`` is the largest m_t seen
    outside a below-threshold stretch and ``margin`` is the noise of the
    comparison (below). The collapse step is the first step of that stretch
    moved back by the median's lag, ``window // 2`` (a step down in the raw
    series shows in the running median half a window later); it is known
    ``patience - 1`` steps after the stretch began, and ``update`` returns True
    on that step.

Why each number (defaults in ``CollapseConfig``):

* Median of ``window=5``: a single outlier batch (one lucky or unlucky draw)
  cannot move it; five steps are short enough that a collapse is seen within
  about three steps of its start. Its noise for Gaussian batch noise is
  sqrt(pi/2) sigma / sqrt(window) (the median's asymptotic efficiency).
* ``sigma``, one step's accuracy noise, is the larger of (i) the binomial
  std over its ``samples = prompts_per_step x group_size`` answers,
  sqrt(p (1 - p) / samples) at p = best, and (ii) the run's own noise,
  std(a_t - a_{t-1}) / sqrt(2) over the last ``NOISE_STEPS = 50`` steps
  before the current stretch, less the newest ``window`` (a fall under way
  must not widen its own margin). (i) alone is a lower bound: the answers
  to one prompt are correlated and prompts differ in difficulty, which a
  simulation with Beta-distributed prompt rates shows inflates the noise
  enough to make (i) fire on noise-only runs; (ii) measures it, and
  successive differences ignore slow trends and a single step change.
* ``margin = noise_z x sqrt(2) x sigma_median``: the difference of two
  medians (best and now) has sqrt(2) their std, and the running best of a
  noisy series sits two to three of its stds above the true level after a
  few hundred steps. ``noise_z=4`` is the smallest of 3, 3.5, 4, 4.5 with no
  false alarm in 240 simulated 400-step binomial runs at p = 0.03-0.6 and 128
  answers a step, and still finds 40 of 40 falls from 0.08 to 0.005 with a
  median delay of 4 steps (bench/collapse_detector.py). This is the absolute
  floor of the rule: it replaces the old fixed "best must reach 0.1" gate, so
  a run whose best stays below 0.1 can still collapse, and only a drop that
  the batch noise cannot explain counts.
* ``drop_fraction=0.5``: a collapse loses at least half of the best
  accuracy, not a few points (the relative part, which dominates above
  p ~ 0.15 at 128 answers per step).
* ``patience=3``: three consecutive smoothed steps below, so that the rule
  can fire by step 9 in a collapse that starts at step 5 (window 5: the
  first median exists at step 4).

A second, slow scale catches slow declines the fast one's margin hides: the
running MEAN of the last ``slow_window=20`` steps, with its own best, the
same collapse line (efficiency 1, window 20: its noise margin is about a
third of the fast one's) and the same patience. A fall over 30-50 steps from
0.19 to 0.06 at a step noise of 0.06 (a run in docs/results.md) stays inside
the fast margin but is caught by the slow scale; an abrupt fall shows on the
fast scale first. Whichever scale fires dates and names the collapse.

A dip that recovers is not a collapse. For ``recover_window`` steps after a
collapse is flagged it is only provisional: if the flagging scale's statistic
climbs back to at least best x (1 - drop_fraction / 2) (half way back from
the collapse line to the best) the flag is revoked, recorded in ``revoked``
and the detector watches again. At the end of the window the MEAN batch
accuracy over its steps must still be below the collapse line drawn at the
flag, or the flag is revoked too: a median of zero-inflated batches (most
prompts unsolved, a few solved by every answer) can sit at the floor for a
while in a noise-only run, while the mean of ``recover_window=20`` steps has
a fifth of one step's noise (bench/collapse_detector.py, docs/benchmarks.md).

Held-out accuracy is the stronger evidence when the run has it
(``update_eval``, greedy accuracy on ``eval_samples`` fixed problems): a
held-out value within its own noise of the best held-out value,
best_eval - 2 sqrt(2) sigma_eval (``EVAL_Z``), revokes a provisional
collapse; a held-out value below drop_fraction x best_eval and below that
noise line confirms it (it can no longer be revoked). The held-out set is
evidence only when it can resolve a collapse at all, i.e. when that noise
line lies above drop_fraction x best_eval (128 problems at a best of 0.09
cannot; at 0.32 they can). After ``recover_window`` steps without recovery
the collapse is final. (With ``run.stop_on_collapse`` the run ends at the
flag and there is no later evidence.)

The moving statistic exists once ``window`` accuracies were seen. A
non-finite accuracy value (no samples) is skipped. A run that never collapsed
is censored at its step count (the steps it ran: docs/design.md 3.6): ``collapsed``
stays False and ``collapse_step`` None; callers must not invent a number for it.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainer.config import CollapseConfig, ExperimentConfig

MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)  # std(median of n) / std(mean of n), large n
NOISE_STEPS = 50  # trailing raw steps for the run's own noise estimate
# Held-out noise band: 2 sqrt(2) sigma is the 95% band of the difference of two independent
# measurements; held-out evaluations are few (every run.eval_every steps), so their best is
# barely inflated and the batch rule's larger noise_z is not needed.
EVAL_Z = 2.0


def binomial_std(p: float, samples: int) -> float:
    """Std of a success share over ``samples`` independent answers at rate p."""
    p = min(max(p, 0.0), 1.0)
    return math.sqrt(p * (1.0 - p) / max(samples, 1))


@dataclass
class _Scale:
    """One smoothing of the batch accuracy: a running median (fast) or mean (slow)."""

    name: str
    window: int
    median: bool
    history: deque = field(default_factory=deque)
    value: float | None = None  # the running statistic
    best: float | None = None
    below_since: int | None = None
    below_count: int = 0

    @property
    def efficiency(self) -> float:
        return MEDIAN_EFFICIENCY if self.median else 1.0

    def push(self, accuracy: float) -> bool:
        """Add a value; True once the window is full (``value`` is then current)."""
        if self.history.maxlen != self.window:
            self.history = deque(self.history, maxlen=self.window)
        self.history.append(accuracy)
        if len(self.history) < self.window:
            return False
        agg = statistics.median if self.median else statistics.fmean
        self.value = agg(self.history)
        return True

    def state(self) -> dict[str, Any]:
        return {
            "history": list(self.history),
            "value": self.value,
            "best": self.best,
            "below_since": self.below_since,
            "below_count": self.below_count,
        }

    def load(self, state: dict[str, Any]) -> None:
        self.history = deque((float(x) for x in state["history"]), maxlen=self.window)
        self.value = state.get("value", state.get("moving_average"))
        self.best = state["best"]
        self.below_since = state["below_since"]
        self.below_count = int(state["below_count"])


class CollapseDetector:
    """Feed one ``update`` per RL step (and ``update_eval`` when held-out accuracy is measured).

    Read ``collapsed``, ``collapse_step``, ``collapse_reason``; ``revoked``
    lists the (step, reason) of collapses that recovered.
    """

    metric: str = "reward/accuracy"  # the batch accuracy's key, named in the collapse reason

    def __init__(self, cfg: CollapseConfig, samples: int = 128, eval_samples: int = 128):
        self.cfg = cfg
        self.samples = samples  # answers per step: prompts_per_step x group_size
        self.eval_samples = eval_samples
        self.fast = _Scale("running median", cfg.window, median=True)
        self.scales = [self.fast]
        if cfg.slow_window > 0:
            self.scales.append(_Scale("running mean", cfg.slow_window, median=False))
        self.raw: deque[float] = deque(maxlen=NOISE_STEPS)  # for the run's own noise
        self.best_eval: float | None = None
        self.collapsed = False
        self.collapse_step: int | None = None
        self.collapse_reason: str | None = None
        self.flagged_at: int | None = None  # step the current collapse became known
        self.flagged_by: str | None = None  # the scale that flagged it
        self.final = False  # True once it can no longer be revoked
        self.flag_threshold: float | None = None  # the collapse line when it was flagged
        self.since_flag: list[float] = []  # batch accuracies after the flag
        self.revoked: list[tuple[int, str]] = []

    # The fast scale's view, as callers and tests read it.
    @property
    def moving_average(self) -> float | None:
        return self.fast.value

    @property
    def best(self) -> float | None:
        return self.fast.best

    @property
    def below_since(self) -> int | None:
        return self.fast.below_since

    # -- the rule ------------------------------------------------------------------
    def margin(self, samples: int | None = None, scale: _Scale | None = None) -> float | None:
        """Noise margin of best - statistic on a scale (module docstring); fast by default."""
        scale = scale or self.fast
        if scale.best is None:
            return None
        sigma = max(
            binomial_std(scale.best, samples or self.samples), self.observed_noise(scale.window)
        )
        sigma_stat = scale.efficiency * sigma / math.sqrt(scale.window)
        return self.cfg.noise_z * math.sqrt(2.0) * sigma_stat

    def observed_noise(self, exclude: int | None = None) -> float:
        """The run's step-to-step noise: std of successive differences / sqrt(2).

        Not a MAD: at low accuracy most batches score 0 and the MAD of the
        differences is 0, which would hide the noise the rare good batches make.
        The newest ``exclude`` values (a window) are left out: a fall under way
        must not widen its own margin.
        """
        exclude = self.cfg.window if exclude is None else exclude
        raw = list(self.raw)[: max(len(self.raw) - exclude, 0)]
        if len(raw) < 10:
            return 0.0
        diffs = [b - a for a, b in itertools.pairwise(raw)]
        return statistics.pstdev(diffs) / math.sqrt(2.0)

    def threshold_of(self, scale: _Scale) -> float | None:
        if scale.best is None:
            return None
        return min(self.cfg.drop_fraction * scale.best, scale.best - self.margin(scale=scale))

    @property
    def threshold(self) -> float | None:
        return self.threshold_of(self.fast)

    @property
    def armed(self) -> bool:
        """The drop rule can fire: the best is far enough above zero for a drop to beat the noise."""
        return any((self.threshold_of(sc) or 0.0) > 0 for sc in self.scales)

    def _scale(self, name: str | None) -> _Scale:
        return next((sc for sc in self.scales if sc.name == name), self.fast)

    @property
    def recovery_level(self) -> float | None:
        best = self._scale(self.flagged_by).best
        return None if best is None else best * (1.0 - self.cfg.drop_fraction / 2.0)

    def update(
        self, step: int, accuracy: float, finite: bool = True, samples: int | None = None
    ) -> bool:
        """Record one step; True on the step a collapse is first detected (again after a revoke)."""
        if self.collapsed and self.final:
            return False
        if not finite:
            return self._collapse(step, step, f"non-finite loss or gradient at step {step}", True)
        if not math.isfinite(accuracy):
            return False
        accuracy = float(accuracy)
        ready = [sc.push(accuracy) for sc in self.scales]
        if not self.collapsed and all(sc.below_since is None for sc in self.scales):
            self.raw.append(accuracy)  # frozen inside a drop: noise of the level before
        if self.collapsed:
            self.since_flag.append(accuracy)
            self._check_recovery(step)
            return False
        if samples is not None:
            self.samples = samples
        for scale, is_ready in zip(self.scales, ready, strict=True):
            if is_ready and self._watch(scale, step):
                return True
        return False

    def _watch(self, scale: _Scale, step: int) -> bool:
        threshold = self.threshold_of(scale)
        if threshold is not None and threshold > 0 and scale.value < threshold:
            if scale.below_since is None:
                scale.below_since = step
            scale.below_count += 1
            if scale.below_count >= self.cfg.patience:
                start = max(scale.below_since - scale.window // 2, 0)
                reason = (
                    f"{self.metric} {scale.name} ({scale.window} steps) fell below "
                    f"{threshold:.4g} = min({self.cfg.drop_fraction:g} x best {scale.best:.4g}, "
                    f"best - noise margin {self.margin(scale=scale):.3g}) for "
                    f"{self.cfg.patience} steps"
                )
                self.flagged_by = scale.name
                return self._collapse(start, step, reason, False, threshold)
            return False
        scale.below_since, scale.below_count = None, 0
        # Below the threshold the statistic is under the best, so only here can the best grow.
        if scale.best is None or scale.value > scale.best:
            scale.best = scale.value
        return False

    def update_eval(self, step: int, accuracy: float, samples: int | None = None) -> None:
        """Held-out accuracy: revokes or confirms a provisional collapse (module docstring)."""
        if not math.isfinite(accuracy):
            return
        n = samples or self.eval_samples
        if self.collapsed and not self.final and self.best_eval is not None:
            sigma = binomial_std(self.best_eval, n)
            noise_line = self.best_eval - EVAL_Z * math.sqrt(2.0) * sigma
            # Evidence only when the held-out set can tell its best from the collapse line.
            informative = noise_line > self.cfg.drop_fraction * self.best_eval
            if not informative:
                pass
            elif accuracy >= noise_line:
                self._revoke(
                    step,
                    f"held-out accuracy {accuracy:.4g} at step {step} within noise of "
                    f"its best {self.best_eval:.4g}",
                )
            elif accuracy < self.cfg.drop_fraction * self.best_eval:
                self.final = True
                self.collapse_reason = (
                    f"{self.collapse_reason}; confirmed by held-out accuracy {accuracy:.4g} "
                    f"at step {step} (best {self.best_eval:.4g})"
                )
        if not self.collapsed and (self.best_eval is None or accuracy > self.best_eval):
            self.best_eval = float(accuracy)

    def _check_recovery(self, step: int) -> None:
        if self.flagged_at is not None and step - self.flagged_at >= self.cfg.recover_window:
            mean = statistics.fmean(self.since_flag) if self.since_flag else math.nan
            if self.flag_threshold is not None and mean >= self.flag_threshold:
                self._revoke(
                    step,
                    f"mean batch accuracy {mean:.4g} over the {len(self.since_flag)} steps "
                    f"after the flag is not below the collapse line {self.flag_threshold:.4g}",
                )
                return
            self.final = True
            return
        scale, level = self._scale(self.flagged_by), self.recovery_level
        if level is not None and scale.value is not None and scale.value >= level:
            self._revoke(
                step, f"{scale.name} {scale.value:.4g} back above {level:.4g} at step {step}"
            )

    def _revoke(self, step: int, why: str) -> None:
        self.revoked.append((int(self.collapse_step), f"{self.collapse_reason}; revoked: {why}"))
        self.collapsed, self.collapse_step, self.collapse_reason = False, None, None
        self.flagged_at, self.flagged_by = None, None
        self.flag_threshold, self.since_flag = None, []
        for scale in self.scales:
            scale.below_since, scale.below_count = None, 0

    def _collapse(
        self, step: int, known_at: int, reason: str, final: bool, threshold: float | None = None
    ) -> bool:
        self.flag_threshold, self.since_flag = threshold, []
        self.collapsed = True
        self.collapse_step = step
        self.collapse_reason = reason
        self.flagged_at = known_at
        self.final = final or self.cfg.recover_window == 0
        return True

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state for checkpoints."""
        return {
            "scales": {sc.name: sc.state() for sc in self.scales},
            "raw": list(self.raw),
            "best_eval": self.best_eval,
            "samples": self.samples,
            "eval_samples": self.eval_samples,
            "collapsed": self.collapsed,
            "collapse_step": self.collapse_step,
            "collapse_reason": self.collapse_reason,
            "flagged_at": self.flagged_at,
            "flagged_by": self.flagged_by,
            "final": self.final,
            "flag_threshold": self.flag_threshold,
            "since_flag": self.since_flag,
            "revoked": [list(r) for r in self.revoked],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "scales" in state:
            for scale in self.scales:
                if scale.name in state["scales"]:
                    scale.load(state["scales"][scale.name])
        else:  # a checkpoint from the single moving-average rule: its history seeds the fast scale
            self.fast.load(state)
        self.raw = deque((float(x) for x in state.get("raw", [])), maxlen=NOISE_STEPS)
        # Checkpoints written before the noise-aware rule lack these: defaults.
        self.best_eval = state.get("best_eval")
        self.samples = int(state.get("samples", self.samples))
        self.eval_samples = int(state.get("eval_samples", self.eval_samples))
        self.collapsed = bool(state["collapsed"])
        self.collapse_step = state["collapse_step"]
        self.collapse_reason = state["collapse_reason"]
        self.flagged_at = state.get("flagged_at", self.collapse_step)
        self.flagged_by = state.get("flagged_by")
        self.final = bool(state.get("final", self.collapsed))
        self.flag_threshold = state.get("flag_threshold")
        self.since_flag = [float(x) for x in state.get("since_flag", [])]
        self.revoked = [(int(s), str(r)) for s, r in state.get("revoked", [])]


def detect_from_rows(
    rows: Iterable[dict[str, Any]],
    cfg: CollapseConfig,
    samples: int,
    eval_samples: int,
    metric: str = "reward/accuracy",
) -> CollapseDetector:
    """Re-run the detector on a run's metrics.jsonl rows (batch and held-out accuracy).

    Lets a study judge runs written by an older detector with the current rule;
    ``metric``: the key the accuracy was read from, named in the reason.
    """
    from trainer import metric_keys as K

    det = CollapseDetector(cfg, samples, eval_samples)
    det.metric = metric
    for row in rows:
        step = int(row["step"])
        if row.get(K.EVAL_ACCURACY) is not None:
            det.update_eval(step, float(row[K.EVAL_ACCURACY]))
        acc = row.get(K.REWARD_ACCURACY)
        det.update(step, float("nan") if acc is None else float(acc))
    return det


# --------------------------------------------------------------------------- across seeds
LOWER_BOUND_PREFIX = ">= "


@dataclass(frozen=True)
class CollapseSummary:
    """A variant's collapse statistics over its seeds (docs/design.md, "collapse definition": censoring).

    A run that never collapsed is censored at its step count: it counts with
    that step, and the mean becomes a lower bound, never an average that
    pretends the survivors collapsed.
    """

    runs: int
    collapsed: int
    mean_step: float | None  # mean over seeds, censored runs at their step count
    lower_bound: bool  # True when any run is censored: the true mean is >= mean_step

    @property
    def label(self) -> str:
        """'812' when every seed collapsed, '>= 1500' when any seed is censored.

        A lower bound is rounded down so that it stays a lower bound.
        """
        if self.mean_step is None:
            return "-"
        if self.lower_bound:
            return f"{LOWER_BOUND_PREFIX}{math.floor(self.mean_step)}"
        return f"{math.floor(self.mean_step + 0.5)}"  # half up, not to even

    @property
    def count_label(self) -> str:
        return f"{self.collapsed}/{self.runs} collapsed"


def summarize_collapses(events: Iterable[tuple[int, bool]]) -> CollapseSummary:
    """Summary of (step, collapsed) events: the collapse step, or the last step if censored."""
    events = [(int(step), bool(collapsed)) for step, collapsed in events]
    if not events:
        return CollapseSummary(0, 0, None, False)
    collapsed = sum(1 for _, c in events if c)
    mean_step = sum(step for step, _ in events) / len(events)
    return CollapseSummary(len(events), collapsed, mean_step, collapsed < len(events))


def rejudge_collapse(cfg: ExperimentConfig, summary: dict, rows: list[dict]) -> dict:
    """The run's collapse judged by the CURRENT rule from its metrics (trainer/analysis/collapse.py).

    A study outlives detector revisions: every run is judged alike, whatever
    version wrote its summary. A non-finite collapse (not in the metrics) is
    kept as recorded; the run-time verdict stays under ``collapse_at_run_time``.
    """
    reason = summary.get("collapse_reason") or ""
    if summary.get("collapsed") and reason.startswith("non-finite"):
        return summary
    det = detect_from_rows(
        rows,
        cfg.run.collapse,
        samples=cfg.rollout.prompts_per_step * cfg.rollout.group_size,
        eval_samples=cfg.task.eval_size,
    )
    return {
        **summary,
        "collapse_at_run_time": [summary.get("collapsed"), summary.get("collapse_step")],
        "collapsed": det.collapsed,
        "collapse_step": det.collapse_step,
        "collapse_reason": det.collapse_reason,
        "collapse_revoked": [list(r) for r in det.revoked],
    }
