"""A trainer stopped because its worker shut down (Ctrl-C to ``make up``, SIGTERM
to the worker, ``docker stop``) was interrupted, not cancelled: the run goes back
to the queue without spending an attempt, the next claim takes attempt + 1 and
resumes it, and every line about it says interrupted and resumes, never cancelled.

The trainer here is a stand-in that does what the real one does when a stop
signal reaches it during its warm start: it writes ``summary.json`` with status
``cancelled`` (it cannot know why it was stopped) and exits 0. It also raises
the worker's shutdown flag itself, through a signal to the worker (this test
process), so the shutdown and the trainer's stop happen at once, as when a
process group or a container is stopped: the supervisor may see the trainer gone
before it passed any stop on.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import pytest
from lab_processes import submit_tiny_run

from lab.jobs import services as jobs
from lab.jobs import spawn, supervisor
from lab.jobs.worker_state import SHUTDOWN
from lab.runs.models import Run, RunStatus
from trainer.run_folder.files import LOG_FILE, SUMMARY_FILE

# argv: run_dir, mode. "direct": the stop signal reached the trainer with the
# worker's (it stops at once); "passed_on": the trainer waits for the supervisor's
# SIGTERM; "outside": only the trainer was signalled, the worker stays up;
# "waits": it trains until the supervisor stops it (a cancel or a pause).
FAKE_TRAINER = """
import json, os, signal, sys, time
from pathlib import Path
run_dir, mode = Path(sys.argv[1]), sys.argv[2]

def stop(*_):
    summary = {"status": "cancelled", "steps": 0}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    print(json.dumps(summary, indent=2), flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
print("warm start step 10/40: loss 2.0  held-out accuracy 0.000", flush=True)
if mode in ("direct", "passed_on"):
    os.kill(os.getppid(), signal.SIGUSR1)  # the worker's shutdown signal
if mode in ("direct", "outside"):
    stop()
time.sleep(60)
"""


@pytest.fixture
def worker(settings, monkeypatch):
    """The worker's shutdown flag raised by SIGUSR1 (Celery's warm-shutdown
    handler sets it the same way, from a signal handler in the main thread)."""
    settings.LAB_POLL_S = 0.05
    settings.LAB_HEARTBEAT_S = 5.0  # the supervisor looks for cancel/shutdown once a second
    previous = signal.signal(signal.SIGUSR1, lambda *_: SHUTDOWN.set())
    SHUTDOWN.clear()
    yield
    SHUTDOWN.clear()
    signal.signal(signal.SIGUSR1, previous)


def _claimed_run(user, experiment, tmp_path, monkeypatch, mode: str):
    run = submit_tiny_run(user, experiment)
    Run.objects.filter(pk=run.pk).update(run_dir=str(tmp_path / "run"))
    monkeypatch.setattr(
        spawn,
        "trainer_command",
        lambda config, run_dir, **_: [sys.executable, "-c", FAKE_TRAINER, str(run_dir), mode],
    )
    return run, jobs.claim_run(run.pk, worker_host="w1")


def _jobs_lines(caplog) -> list[str]:
    """The worker's lines about the run (not the command line, which holds the stand-in)."""
    lines = [r.getMessage() for r in caplog.records if r.name == "jobs"]
    return [line for line in lines if FAKE_TRAINER not in line]


@pytest.mark.parametrize("mode", ["direct", "passed_on"])
def test_worker_shutdown_interrupts_the_run_and_the_next_claim_resumes_it(
    mode, worker, user, experiment, tmp_path, monkeypatch, caplog,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    run, claim = _claimed_run(user, experiment, tmp_path, monkeypatch, mode)
    allowance = Run.objects.get(pk=run.pk).max_attempts
    with (
        caplog.at_level(logging.INFO, logger="jobs"),
        django_capture_on_commit_callbacks(execute=False) as published,
    ):
        assert supervisor.execute_claim(claim) == "requeued"

    back = Run.objects.get(pk=run.pk)
    assert back.status == RunStatus.QUEUED, back.error
    assert len(published) == 1  # its wake-up, for the next worker
    # Not spent: the allowance grows, the fencing token (attempts) never goes back.
    assert back.attempts == 1 and back.max_attempts == allowance + 1
    assert "interrupted" in back.error and "resumes" in back.error
    assert "cancel" not in back.error.lower()
    said = [line for line in _jobs_lines(caplog) if "interrupted" in line]
    assert said and "resumes the warm start" in said[0]
    assert not any("cancel" in line.lower() for line in _jobs_lines(caplog))
    run_dir = Path(back.run_dir)
    assert not (run_dir / SUMMARY_FILE).exists()  # the stop's "cancelled" is no outcome
    last = (run_dir / LOG_FILE).read_text().strip().splitlines()[-1]
    assert last.startswith("=== attempt 1 interrupted") and "resumes" in last

    again = jobs.claim_run(run.pk, worker_host="w2")
    assert again is not None and again.attempt == 2  # the counter advances on the re-claim


def test_a_trainer_signalled_from_outside_is_requeued_not_cancelled(
    worker, user, experiment, tmp_path, monkeypatch
):
    """Nobody cancelled and the worker stays up: the attempt is spent (a stop that
    repeats ends the run once attempts run out), but the run is not cancelled."""
    run, claim = _claimed_run(user, experiment, tmp_path, monkeypatch, "outside")
    allowance = Run.objects.get(pk=run.pk).max_attempts
    assert supervisor.execute_claim(claim) == "requeued"
    back = Run.objects.get(pk=run.pk)
    assert back.status == RunStatus.QUEUED and back.max_attempts == allowance
    assert back.error.startswith("attempt 1: interrupted") and "cancel" not in back.error.lower()
    assert jobs.claim_run(run.pk, worker_host="w1").attempt == 2


def test_a_cancel_is_still_a_cancel(worker, user, experiment, tmp_path, monkeypatch):
    run, claim = _claimed_run(user, experiment, tmp_path, monkeypatch, "outside")
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    assert supervisor.execute_claim(claim) == RunStatus.CANCELLED
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED


def test_a_paused_run_stops_and_waits_paused_with_its_attempt_given_back(
    worker, user, experiment, tmp_path, monkeypatch, django_capture_on_commit_callbacks
):
    """Its sweep was paused while it trained: the supervisor stops the trainer, and
    the run comes back queued, held (no worker claims it) and unspent."""
    run, claim = _claimed_run(user, experiment, tmp_path, monkeypatch, "waits")
    allowance = Run.objects.get(pk=run.pk).max_attempts
    Run.objects.filter(pk=run.pk).update(paused=True)
    with django_capture_on_commit_callbacks(execute=True):
        assert supervisor.execute_claim(claim) == "paused"
    back = Run.objects.get(pk=run.pk)
    assert back.status == RunStatus.QUEUED and back.paused and back.waits_paused
    assert back.max_attempts == allowance + 1  # not spent
    assert "its sweep was paused" in back.error and "cancel" not in back.error.lower()
    assert jobs.claim_run(run.pk, worker_host="w2") is None  # held
    assert jobs.claim_next(run.queue, worker_host="w2") is None
