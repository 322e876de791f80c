"""One line telling what a run's trainer is doing before and around RL step 0.

The worker stores the trainer's progress.json on the run (``Run.phase``,
``Run.phase_progress``; keys in trainer/metric_keys.py). A warm start takes
minutes with no RL step to chart, so the run page says so, with its progress
and ETA, and says when the base policy came from the cache instead.
"""

from __future__ import annotations

from lab.runs.models import Run, RunStatus
from trainer import metric_keys as mk
from trainer.run_folder.warmstart_progress import format_eta


def _pct(value) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, int | float) else "?"


def phase_line(run: Run) -> str:
    """E.g. "warm start: SFT step 150/3000 · held-out accuracy 8% (target 20%) · ETA ~40 s";
    "" for a queued run or one with nothing to say."""
    progress = run.phase_progress or {}
    if run.phase == mk.PHASE_WARMSTART and run.status == RunStatus.RUNNING:
        step = progress.get(mk.WARMSTART_STEP, 0)
        limit = progress.get(mk.WARMSTART_MAX_STEPS, "?")
        return (
            f"warm start (supervised base policy before RL step 0): SFT step {step}/{limit} · "
            f"held-out accuracy {_pct(progress.get(mk.WARMSTART_ACCURACY))} "
            f"(target {_pct(progress.get(mk.WARMSTART_TARGET))}) · "
            f"{format_eta(progress.get(mk.WARMSTART_ETA_S))}"
        )
    if run.phase == mk.PHASE_TRAINING:
        accuracy = _pct(progress.get(mk.WARMSTART_ACCURACY))
        if progress.get(mk.WARMSTART_CACHED):
            return f"using cached base policy (held-out accuracy {accuracy})"
        steps = progress.get(mk.WARMSTART_STEP, "?")
        return f"base policy warm-started in {steps} SFT steps (held-out accuracy {accuracy})"
    if run.status == RunStatus.RUNNING:
        return "starting the trainer"
    return ""


def progress_bar(run: Run) -> tuple[int, int]:
    """(value, max) of the run page's progress bar: the SFT steps of the warm start
    while it runs (RL step 0 has not come yet), else the RL steps."""
    progress = run.phase_progress or {}
    if run.phase == mk.PHASE_WARMSTART and run.status == RunStatus.RUNNING:
        limit = progress.get(mk.WARMSTART_MAX_STEPS)
        if isinstance(limit, int) and limit > 0:
            return min(int(progress.get(mk.WARMSTART_STEP) or 0), limit), limit
    return run.current_step, run.total_steps
