"""End to end with real processes: web server, Celery workers and the real
trainer CLI, on Redis and on the embedded filesystem broker (each test runs
on both, see the ``lab_stack`` fixture)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from lab_processes import TINY_OVERRIDES

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]


def _submit(stack, **overrides) -> dict:
    exp = stack.post("/api/experiments", {"name": "e2e", "preset": "moe-grpo"})
    return stack.post(
        "/api/runs",
        {
            "experiment": exp["id"],
            "preset": "moe-grpo",
            "overrides": {**TINY_OVERRIDES, **overrides},
            "queue": stack.queue,
        },
    )


def _steps(stack, run_id: int) -> list[int]:
    body = stack.get(f"/api/runs/{run_id}/metrics?keys=reward/accuracy&max_points=100000")
    return body["steps"]


def test_worker_registers_its_queue_in_health(lab_stack):
    lab_stack.start_worker("w1")
    health = lab_stack.wait_for(
        lambda: (h := lab_stack.get("/api/health"))["workers"] and h, 90, "worker registration"
    )
    assert health["db"]["ok"] and health["broker"]["ok"]
    assert lab_stack.queue in health["queues"]
    assert health["workers"][0]["hostname"] == "w1@e2e"


def test_cancelled_queued_run_is_skipped_by_the_worker(lab_stack):
    run = _submit(lab_stack)
    cancelled = lab_stack.post(f"/api/runs/{run['id']}/cancel")
    assert cancelled["status"] == "cancelled"
    lab_stack.start_worker("w1")
    lab_stack.wait_for(lambda: "skipping" in lab_stack.log("w1"), 90, "the delivery to be skipped")
    after = lab_stack.run(run["id"])
    assert after["status"] == "cancelled" and after["attempts"] == 0


def test_submit_train_and_store_results(lab_stack):
    lab_stack.start_worker("w1")
    run = _submit(lab_stack)
    assert run["status"] == "queued"
    running = lab_stack.wait_status(run["id"], {"running", "succeeded"})
    assert running["worker_host"] == "w1@e2e"
    done = lab_stack.wait_status(run["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded", done["error"]
    assert done["summary"]["status"] == "succeeded"
    assert done["current_step"] == done["total_steps"] == 3
    steps = _steps(lab_stack, run["id"])
    assert len(steps) == 3 and len(set(steps)) == 3
    assert Path(done["run_dir"], "summary.json").exists()


def test_cancel_a_running_run(lab_stack):
    lab_stack.start_worker("w1")
    run = _submit(lab_stack, **{"run.steps": 500})
    lab_stack.wait_for(lambda: lab_stack.run(run["id"])["current_step"] >= 1, 180, "first step")
    lab_stack.post(f"/api/runs/{run['id']}/cancel")
    done = lab_stack.wait_status(run["id"], {"cancelled", "succeeded", "failed"})
    assert done["status"] == "cancelled", done["error"]
    assert done["current_step"] < 500


def test_killed_worker_is_recovered_and_every_step_is_stored_once(lab_stack):
    total = 16
    lab_stack.start_worker("w1")
    run = _submit(lab_stack, **{"run.steps": total, "run.checkpoint_every": 2})
    lab_stack.wait_for(lambda: lab_stack.run(run["id"])["current_step"] >= 5, 240, "step 5")
    lab_stack.kill("w1")  # SIGKILL: no cleanup, the trainer dies with it
    lost = lab_stack.run(run["id"])
    assert lost["status"] == "running"

    lab_stack.start_reconciler()
    lab_stack.start_worker("w2")
    done = lab_stack.wait_status(run["id"], {"succeeded", "failed"}, timeout=400)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] == 2 and done["worker_host"] == "w2@e2e"
    steps = _steps(lab_stack, run["id"])
    assert steps == sorted(set(steps)) and len(steps) == total
    log = Path(done["run_dir"], "trainer.log").read_text()
    assert "--resume" in log.split("=== attempt 2")[1]
    time.sleep(0.1)


def test_trainer_rejecting_its_config_fails_the_run_with_the_reason(lab_stack):
    """A config the trainer refuses (here: edited in the DB behind the API's back)
    ends as failed with the trainer's field-path message, and the worker lives on."""
    run = _submit(lab_stack)
    lab_stack.manage(
        "shell", "-c",
        f"from runs.models import Run; r = Run.objects.get(pk={run['id']}); "
        "r.config['run']['steps'] = 'many'; r.save()",
    )  # fmt: skip
    lab_stack.start_worker("w1")
    done = lab_stack.wait_status(run["id"], {"failed", "succeeded"}, timeout=120)
    assert done["status"] == "failed"
    assert "invalid config" in done["error"] and "run.steps" in done["error"]
    assert lab_stack.procs["w1"].poll() is None


def test_worker_shutdown_gives_the_run_back_and_it_resumes(lab_stack):
    """SIGTERM (Ctrl-C, docker stop): the trainer checkpoints, the run returns to
    the queue without spending an attempt, and the next worker resumes it."""
    total = 12
    lab_stack.start_worker("w1")
    run = _submit(lab_stack, **{"run.steps": total, "run.checkpoint_every": 2})
    lab_stack.wait_for(lambda: lab_stack.run(run["id"])["current_step"] >= 3, 240, "step 3")
    lab_stack.kill("w1", signal.SIGTERM)
    back = lab_stack.run(run["id"])
    assert back["status"] == "queued" and back["attempts"] == 0, back
    lab_stack.start_worker("w2")
    done = lab_stack.wait_status(run["id"], {"succeeded", "failed"}, timeout=400)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] == 1
    steps = _steps(lab_stack, run["id"])
    assert steps == sorted(set(steps)) and len(steps) == total
