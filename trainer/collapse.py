"""Collapse detection (DESIGN.md 3.5), resumable.

A run collapses at the first step where either

(a) the loss or a gradient is not finite (``update(..., finite=False)``), or
(b) the moving average of reward/accuracy over the last ``window`` steps falls
    below ``drop_fraction`` x its best value so far, after that best reached
    ``floor``, and stays below for ``patience`` consecutive steps.

For (b) the collapse step is the FIRST step of the below-threshold stretch,
although it is only known ``patience - 1`` steps later; ``update`` returns True
on the step the collapse becomes known. The moving average exists once
``window`` accuracies were seen; before that neither the best nor the drop
rule moves. A non-finite accuracy value (no samples) is skipped. A run that
never collapses is censored at its last step: ``collapsed`` stays False and
``collapse_step`` None; callers must not invent a number for it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainer.config import CollapseConfig


class CollapseDetector:
    """Feed one ``update`` per RL step; read ``collapsed``, ``collapse_step``, ``collapse_reason``."""

    def __init__(self, cfg: CollapseConfig):
        self.cfg = cfg
        self.history: deque[float] = deque(maxlen=cfg.window)
        self.moving_average: float | None = None
        self.best: float | None = None
        self.below_since: int | None = None  # first step of the current below-threshold stretch
        self.below_count = 0
        self.collapsed = False
        self.collapse_step: int | None = None
        self.collapse_reason: str | None = None

    @property
    def armed(self) -> bool:
        """The drop rule applies once the best moving average reached the floor."""
        return self.best is not None and self.best >= self.cfg.floor

    @property
    def threshold(self) -> float | None:
        return self.cfg.drop_fraction * self.best if self.armed else None

    def update(self, step: int, accuracy: float, finite: bool = True) -> bool:
        """Record one step; True exactly once, on the step collapse is first detected."""
        if self.collapsed:
            return False
        if not finite:
            return self._collapse(step, f"non-finite loss or gradient at step {step}")
        if not math.isfinite(accuracy):
            return False
        self.history.append(float(accuracy))
        if len(self.history) < self.cfg.window:
            return False
        self.moving_average = sum(self.history) / len(self.history)

        threshold = self.threshold
        if threshold is not None and self.moving_average < threshold:
            if self.below_since is None:
                self.below_since = step
            self.below_count += 1
            if self.below_count >= self.cfg.patience:
                reason = (
                    f"reward/accuracy moving average fell below {self.cfg.drop_fraction:g} "
                    f"of its best {self.best:.4g} (after passing floor {self.cfg.floor:g}) "
                    f"for {self.cfg.patience} steps"
                )
                return self._collapse(self.below_since, reason)
            return False

        self.below_since, self.below_count = None, 0
        # Below the threshold the average is under the best, so only here can the best grow.
        if self.best is None or self.moving_average > self.best:
            self.best = self.moving_average
        return False

    def _collapse(self, step: int, reason: str) -> bool:
        self.collapsed = True
        self.collapse_step = step
        self.collapse_reason = reason
        return True

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state for checkpoints."""
        return {
            "history": list(self.history),
            "moving_average": self.moving_average,
            "best": self.best,
            "below_since": self.below_since,
            "below_count": self.below_count,
            "collapsed": self.collapsed,
            "collapse_step": self.collapse_step,
            "collapse_reason": self.collapse_reason,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = deque((float(x) for x in state["history"]), maxlen=self.cfg.window)
        self.moving_average = state["moving_average"]
        self.best = state["best"]
        self.below_since = state["below_since"]
        self.below_count = int(state["below_count"])
        self.collapsed = bool(state["collapsed"])
        self.collapse_step = state["collapse_step"]
        self.collapse_reason = state["collapse_reason"]


# --------------------------------------------------------------------------- across seeds
LOWER_BOUND_PREFIX = ">= "


@dataclass(frozen=True)
class CollapseSummary:
    """A variant's collapse statistics over its seeds (DESIGN.md 3.5, censoring).

    A run that never collapsed is censored at its last step: it counts with
    that step, and the mean becomes a lower bound, never an average that
    pretends the survivors collapsed.
    """

    runs: int
    collapsed: int
    mean_step: float | None  # mean over seeds, censored runs at their last step
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
