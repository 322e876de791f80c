"""The worker stores the trainer's warm-start phase (RUN_DIR/progress.json) on the run."""

from __future__ import annotations

import os
import time

from lab.jobs.progress import poll_progress
from lab.runs import lifecycle
from lab.runs.models import Run
from trainer import metric_keys as K
from trainer.run_folder.files import PROGRESS_FILE, write_json_atomic


def _running_run(user, experiment, tiny, attempt=1):
    run = lifecycle.submit_run(owner=user, experiment=experiment, preset="moe-grpo", overrides=tiny)
    Run.objects.filter(pk=run.pk).update(status="running", attempts=attempt)
    return run


def test_progress_json_lands_on_the_run(user, experiment, tiny, tmp_path):
    run = _running_run(user, experiment, tiny)
    started = time.time() - 1
    write_json_atomic(
        tmp_path / PROGRESS_FILE,
        {K.PHASE: "warmstart", K.WARMSTART_STEP: 150, K.WARMSTART_ACCURACY: 0.08,
         K.WARMSTART_TARGET: 0.2, K.WARMSTART_ETA_S: 42.0, K.WARMSTART_CACHED: False,
         "unrelated": 1},
    )  # fmt: skip
    seen = poll_progress(tmp_path, run.pk, 1, started)
    run.refresh_from_db()
    assert seen > started and run.phase == "warmstart"
    assert run.phase_progress[K.WARMSTART_STEP] == 150 and "unrelated" not in run.phase_progress
    # Unchanged file: not read again (the poll loop runs every 0.1-1 s).
    Run.objects.filter(pk=run.pk).update(phase="")
    assert poll_progress(tmp_path, run.pk, 1, seen) == seen
    assert Run.objects.get(pk=run.pk).phase == ""


def test_a_previous_attempts_file_and_a_lost_attempt_write_nothing(
    user, experiment, tiny, tmp_path
):
    run = _running_run(user, experiment, tiny, attempt=2)
    path = tmp_path / PROGRESS_FILE
    write_json_atomic(path, {K.PHASE: "training", K.WARMSTART_CACHED: True})
    old = time.time() - 100
    os.utime(path, (old, old))
    poll_progress(tmp_path, run.pk, 2, time.time() - 10)  # older than this attempt
    assert Run.objects.get(pk=run.pk).phase == ""
    poll_progress(tmp_path, run.pk, 1, old - 1)  # attempt 1 lost the run to attempt 2
    assert Run.objects.get(pk=run.pk).phase == ""
    poll_progress(tmp_path, run.pk, 2, old - 1)
    assert Run.objects.get(pk=run.pk).phase == "training"
