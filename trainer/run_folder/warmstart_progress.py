"""Warm-start progress: the phase before RL step 0, told to people and to the worker.

The supervised warm start (trainer/run/warmstart.py) can take minutes, during which
metrics.jsonl is empty: it holds one object per RL step and nothing else. So the
trainer reports this phase separately:

* ``RUN_DIR/progress.json``, rewritten atomically at each warm-start check:
  ``{"phase": "warmstart" | "training", "warmstart/step": ..., ...}`` with the
  ``warmstart/`` keys of trainer/metric_keys.py. The worker polls it and stores
  it on the run; ``phase`` turns to ``training`` when the base policy is ready.
* a log line per check with the held-out accuracy, its target and an ETA, which
  the CLI prints and the worker keeps in trainer.log; a warm start that resumes
  an interrupted one's saved state (trainer/run/warmstart.py) says so, and its
  ``warmstart/step`` continues from there.

ETA: the pace so far (seconds per SFT step) times the steps still expected. The
steps expected come from the accuracy's climb since the first check, extended in
a straight line to the target, and never more than ``warm_start.max_steps``
allows; before two checks only that upper bound is known.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer import metric_keys as mk
from trainer.run_folder.files import PROGRESS_FILE, write_json_atomic


def eta_seconds(
    *,
    step: int,
    max_steps: int,
    elapsed_s: float,
    accuracy: float,
    first_accuracy: float,
    target: float,
    first_step: int = 0,
) -> float | None:
    """Seconds until the warm start should stop (see the module docstring); None at step 0.
    ``elapsed_s`` is the time since ``first_step`` (a resumed warm start's pace is
    this process's own); the climb is counted from step 0."""
    if step <= first_step or elapsed_s <= 0:
        return None
    per_step = elapsed_s / (step - first_step)
    left = max(0, max_steps - step)
    climb = (accuracy - first_accuracy) / step
    if accuracy >= target:
        left = 0
    elif climb > 0:
        left = min(left, int((target - accuracy) / climb) + 1)
    return left * per_step


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA unknown"
    if seconds < 90:
        return f"ETA ~{seconds:.0f} s"
    return f"ETA ~{seconds / 60:.0f} min"


class WarmStartReporter:
    """Writes progress.json (when given a run folder) and the log line of each check."""

    def __init__(
        self,
        run_dir: Path | None,
        *,
        max_steps: int,
        target: float,
        log: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = run_dir / PROGRESS_FILE if run_dir is not None else None
        self.max_steps = max_steps
        self.target = target
        self.log = log
        self.clock = clock
        self.started = clock()
        self.first_step = 0  # where this process's warm start began (a resumed one: later)
        self.first_accuracy: float | None = None
        self.state: dict[str, Any] = {
            mk.PHASE: mk.PHASE_WARMSTART,
            mk.WARMSTART_STEP: 0,
            mk.WARMSTART_MAX_STEPS: max_steps,
            mk.WARMSTART_TARGET: target,
            mk.WARMSTART_CACHED: False,
        }

    def _write(self) -> None:
        if self.path is not None:
            write_json_atomic(self.path, self.state)

    def begin(self, accuracy: float) -> None:
        """The untrained base's accuracy, before the first SFT step."""
        self.first_accuracy = accuracy
        self.started = self.clock()
        self.state[mk.WARMSTART_ACCURACY] = accuracy
        self.state[mk.WARMSTART_ETA_S] = None
        self._write()

    def resumed(self, step: int, first_accuracy: float, accuracy: float) -> None:
        """An interrupted warm start's saved state was loaded: it goes on from ``step``."""
        self.first_accuracy = first_accuracy
        self.first_step = step
        self.started = self.clock()
        self.state.update(
            {mk.WARMSTART_STEP: step, mk.WARMSTART_ACCURACY: accuracy, mk.WARMSTART_ETA_S: None}
        )
        self._write()
        self.log(
            f"warm start: resuming at step {step}/{self.max_steps} from the state an "
            f"interrupted warm start saved (held-out accuracy {accuracy:.3f} at its last check)"
        )

    def check(self, step: int, loss: float, accuracy: float) -> None:
        """One held-out check during the warm start."""
        eta = eta_seconds(
            step=step,
            max_steps=self.max_steps,
            elapsed_s=self.clock() - self.started,
            accuracy=accuracy,
            first_accuracy=accuracy if self.first_accuracy is None else self.first_accuracy,
            target=self.target,
            first_step=self.first_step,
        )
        self.state.update(
            {
                mk.WARMSTART_STEP: step,
                mk.WARMSTART_LOSS: loss,
                mk.WARMSTART_ACCURACY: accuracy,
                mk.WARMSTART_ETA_S: eta,
            }
        )
        self._write()
        self.log(
            f"warm start step {step}/{self.max_steps}: loss {loss:.3f}  held-out accuracy "
            f"{accuracy:.3f} (target {self.target:.2f})  {format_eta(eta)}"
        )

    def cached(self, accuracy: float, steps: int) -> None:
        """The base policy came from the cache: no warm start to wait for."""
        self.state.update(
            {
                mk.WARMSTART_STEP: steps,
                mk.WARMSTART_ACCURACY: accuracy,
                mk.WARMSTART_ETA_S: 0.0,
                mk.WARMSTART_CACHED: True,
            }
        )
        self.log(f"warm start: using the cached base policy (held-out accuracy {accuracy:.3f})")
        self.finish()

    def finish(self) -> None:
        """The base policy is ready: RL training starts."""
        self.state[mk.PHASE] = mk.PHASE_TRAINING
        self.state[mk.WARMSTART_ETA_S] = 0.0
        self._write()


def read_progress(run_dir: Path) -> dict[str, Any] | None:
    """progress.json as written, or None when absent or half-read (never raises)."""
    try:
        data = json.loads((run_dir / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
