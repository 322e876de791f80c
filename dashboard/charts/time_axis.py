"""A chart's x axis: training steps, wall-clock time or time since the run started.

Series are read, windowed and thinned by step (the metric store's axis); on a time
axis each run's kept steps are then placed at the times they were logged, from that
run's ``StepClock`` (when each step was written: a lab run's ``time/wall``, an
external run's logged timestamps). Wall-clock time shows when things happened
(a generation stall is a gap on it); relative time puts runs that started at
different times side by side, each from its own start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

XMode = Literal["step", "wall", "relative"]
X_MODES: tuple[str, ...] = ("step", "wall", "relative")
X_MODE_TITLES = {"step": "step", "wall": "wall clock", "relative": "time since the run started"}
HOURS_FROM_S = 2 * 3600  # a relative axis in hours from this span on, else in minutes


@dataclass(frozen=True)
class StepClock:
    """When a run's steps were logged: ``steps`` (n,) ascending, ``times_s`` (n,) unix
    seconds; ``start_s`` the run's start (relative time's zero; default its first
    step's time)."""

    steps: np.ndarray
    times_s: np.ndarray
    start_s: float | None = None

    def at(self, steps: Sequence[int] | np.ndarray) -> np.ndarray:
        """Times (s) of ``steps``: logged ones exactly, others between their neighbours
        (linear), past the ends at the nearest known step's time; NaN without a clock."""
        x = np.asarray(steps, dtype=np.float64)
        if self.steps.size == 0:
            return np.full(x.shape, np.nan)
        return np.interp(x, self.steps.astype(np.float64), self.times_s.astype(np.float64))

    @property
    def zero_s(self) -> float:
        if self.start_s is not None:
            return float(self.start_s)
        return float(self.times_s[0]) if self.times_s.size else 0.0


@dataclass(frozen=True)
class TimeAxis:
    """How a chart places its runs' steps: ``mode`` and each trace label's clock."""

    mode: XMode = "step"
    clocks: Mapping[str, StepClock] = field(default_factory=dict)

    @property
    def is_time(self) -> bool:
        return self.mode != "step"

    def _relative_unit(self) -> tuple[float, str]:
        span = max(
            (float(c.times_s[-1]) - c.zero_s for c in self.clocks.values() if c.times_s.size),
            default=0.0,
        )
        return (3600.0, "h") if span >= HOURS_FROM_S else (60.0, "min")

    def x(self, label: str, steps: Sequence[int] | np.ndarray) -> np.ndarray:
        """The x values of ``steps`` of the trace ``label``: steps, ms since the epoch
        (a date axis) or hours/minutes since the run started."""
        if self.mode == "step":
            return np.asarray(steps)
        clock = self.clocks.get(label)
        if clock is None:
            return np.full(len(steps), np.nan)
        seconds = clock.at(steps)
        if self.mode == "wall":
            return np.round(seconds * 1000.0)
        scale, _ = self._relative_unit()
        return (seconds - clock.zero_s) / scale

    def axis(self) -> dict[str, Any]:
        """The x axis's layout for a time mode (title, date type, hover format)."""
        if self.mode == "wall":
            return {
                "type": "date",
                "title": {"text": X_MODE_TITLES["wall"]},
                "hoverformat": "%Y-%m-%d %H:%M:%S",
            }
        _, unit = self._relative_unit()
        return {
            "type": "linear",
            "title": {"text": f"{X_MODE_TITLES['relative']} ({unit})"},
            "hoverformat": ".2f",
            "rangemode": "tozero",
        }
