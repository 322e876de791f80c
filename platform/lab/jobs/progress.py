"""The trainer's warm-start phase, polled from RUN_DIR/progress.json onto the run.

Called from the supervisor's poll loop (``poll_progress``, lab/jobs/watch.py): a
file is read only when its modification time moved past the last one seen (a
previous attempt's file is older than this attempt and is never read), and the
write is fenced like a heartbeat (status running, this attempt), so an attempt
the reconciler gave away writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.runs.models import Run, RunStatus
from trainer import metric_keys as mk
from trainer.run_folder.files import PROGRESS_FILE
from trainer.run_folder.warmstart_progress import read_progress

KNOWN_PHASES = (mk.PHASE_WARMSTART, mk.PHASE_TRAINING)


def record_progress(run_id: int, attempt: int, data: dict[str, Any]) -> bool:
    """Store the phase and its progress on the run; False when this attempt lost it."""
    phase = data.get(mk.PHASE)
    if phase not in KNOWN_PHASES:
        return False
    progress = {k: data[k] for k in mk.WARMSTART_KEYS if k in data}
    return bool(
        Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, attempts=attempt).update(
            phase=phase, phase_progress=progress
        )
    )


def poll_progress(run_dir: Path, run_id: int, attempt: int, seen_mtime: float) -> float:
    """Record progress.json if it changed since ``seen_mtime``; returns the mtime now seen."""
    try:
        mtime = (run_dir / PROGRESS_FILE).stat().st_mtime
    except OSError:
        return seen_mtime
    if mtime <= seen_mtime:
        return seen_mtime
    data = read_progress(run_dir)
    if data is None:  # caught between write and rename cannot happen (atomic); unreadable
        return seen_mtime
    record_progress(run_id, attempt, data)
    return mtime
