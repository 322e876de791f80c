"""End to end with real processes: web server, Celery workers and the real
trainer CLI, on Redis and on the embedded filesystem broker. A test about
delivery runs on both (the ``lab_stack`` fixture); one the database decides
runs on the filesystem broker only (``ONE_BROKER``, tests/lab_processes.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from lab_processes import ONE_BROKER, REDIS_URL, TINY_OVERRIDES

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


@ONE_BROKER
def test_worker_registers_its_queue_in_health(lab_stack):
    lab_stack.start_worker("w1")
    health = lab_stack.wait_for(
        lambda: (h := lab_stack.request("GET", "/api/health")[1])["workers"] and h,
        90,
        "worker registration",
    )
    assert health["db"]["ok"] and health["broker"]["ok"]
    assert health["status"] == "unavailable" and not health["reconciler"]["ok"]  # none started
    assert lab_stack.queue in health["queues"]
    assert health["workers"][0]["hostname"] == "w1@e2e"


@ONE_BROKER
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


@ONE_BROKER
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


@ONE_BROKER
def test_trainer_rejecting_its_config_fails_the_run_with_the_reason(lab_stack):
    """A config the trainer refuses (here: edited in the DB behind the API's back)
    ends as failed with the trainer's field-path message, and the worker lives on."""
    run = _submit(lab_stack)
    lab_stack.manage(
        "shell", "-c",
        f"from lab.runs.models import Run; r = Run.objects.get(pk={run['id']}); "
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
    # not spent: the allowance grows; the attempt number (the fencing token) never repeats
    assert back["status"] == "queued" and back["attempts"] == 1, back
    assert back["max_attempts"] == 4, back
    lab_stack.start_worker("w2")
    done = lab_stack.wait_status(run["id"], {"succeeded", "failed"}, timeout=400)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] == 2
    steps = _steps(lab_stack, run["id"])
    assert steps == sorted(set(steps)) and len(steps) == total


@ONE_BROKER
def test_a_warm_start_interrupted_by_a_worker_shutdown_resumes_where_it_stopped(
    lab_stack, tmp_path
):
    """Ctrl-C or SIGTERM while the run is still in its warm start: the warm start
    saves its state, the run is interrupted (not cancelled) and back in the queue
    unspent, and the next worker's attempt (attempt 2) resumes the warm start at
    the step it stopped, instead of starting it again from step 0."""
    lab_stack.env["MOE_LAB_CACHE"] = str(tmp_path / "cache")  # no cached base to reuse
    lab_stack.start_worker("w1")
    long_warm_start = {
        "warm_start.max_steps": 5000,
        "warm_start.eval_every": 5,
        "warm_start.eval_size": 8,
        "warm_start.batch_size": 8,
        "warm_start.target_accuracy_low": 0.99,  # out of reach: it runs until stopped
        "warm_start.target_accuracy_high": 1.0,
    }
    run = _submit(lab_stack, **long_warm_start)
    trainer_log = Path(lab_stack.wait_status(run["id"], {"running"}, 120)["run_dir"], "trainer.log")

    def log_text() -> str:
        return trainer_log.read_text() if trainer_log.exists() else ""

    lab_stack.wait_for(lambda: "warm start step 10/" in log_text(), 240, "warm start step 10")
    lab_stack.kill("w1", signal.SIGTERM)
    back = lab_stack.run(run["id"])
    assert back["status"] == "queued" and back["attempts"] == 1, back
    assert "interrupted" in back["error"] and "cancel" not in back["error"].lower(), back
    stopped = re.search(r"warm start stopped at step (\d+)", log_text())
    assert stopped, log_text()[-3000:]
    assert log_text().strip().splitlines()[-1].startswith("=== attempt 1 interrupted")

    lab_stack.start_worker("w2")
    lab_stack.wait_for(lambda: "resuming at step" in log_text(), 240, "the warm start to resume")
    again = lab_stack.run(run["id"])
    assert again["attempts"] == 2 and again["status"] == "running", again
    resumed = re.search(r"resuming at step (\d+)/", log_text())
    assert int(resumed.group(1)) == int(stopped.group(1)) >= 10
    lab_stack.post(f"/api/runs/{run['id']}/cancel")  # a real cancel now: done
    done = lab_stack.wait_status(run["id"], {"cancelled", "failed", "succeeded"}, 120)
    assert done["status"] == "cancelled", done["error"]


# ---------------------------------------------------------------- the queue of record


def _drop_broker_messages(stack) -> int:
    """What a broker that lost its data looks like: this stack's waiting messages
    gone (returns how many)."""
    if stack.env["CELERY_BROKER_URL"].startswith("redis"):
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        lists = [k for k in client.keys(f"{stack.queue}*") if client.type(k) == b"list"]
        dropped = sum(client.llen(k) for k in lists)
        if lists:
            client.delete(*lists)
        return dropped
    files = list((stack.root / "var" / "broker" / "queue").glob(f"*.{stack.queue}.msg"))
    for path in files:
        path.unlink()
    return len(files)


def _file_steps(run_dir: str) -> list[int]:
    lines = Path(run_dir, "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if line.strip()]


def test_runs_whose_messages_the_broker_lost_still_run_exactly_once(lab_stack):
    runs = [_submit(lab_stack) for _ in range(2)]
    assert _drop_broker_messages(lab_stack) >= 2
    lab_stack.env["LAB_REPUBLISH_AFTER_S"] = "1"
    lab_stack.start_reconciler()
    lab_stack.start_worker("w1")
    for run in runs:
        done = lab_stack.wait_status(run["id"], {"succeeded", "failed"}, timeout=240)
        assert done["status"] == "succeeded", done["error"]
        assert done["attempts"] == 1
        assert _steps(lab_stack, run["id"]) == [0, 1, 2]
        assert "=== attempt 2" not in Path(done["run_dir"], "trainer.log").read_text()


def test_priority_9_submitted_behind_20_queued_runs_starts_next(lab_stack):
    waiting = [_submit(lab_stack) for _ in range(20)]
    exp = waiting[0]["experiment"]
    # Priorities above LAB_MAX_USER_PRIORITY are an operator's; the same login becomes staff.
    lab_stack.manage("lab_user", "--username", "e2e", "--password", "pw", "--superuser")
    urgent = lab_stack.post(
        "/api/runs",
        {"experiment": exp, "preset": "moe-grpo", "overrides": TINY_OVERRIDES,
         "queue": lab_stack.queue, "priority": 9},
    )  # fmt: skip
    assert lab_stack.run(urgent["id"])["queue_position"] == 1  # what the page shows
    lab_stack.start_worker("w1")
    first = lab_stack.wait_for(
        lambda: [r for r in [urgent, *waiting] if lab_stack.run(r["id"])["status"] != "queued"],
        120, "a run to start",
    )  # fmt: skip
    assert [r["id"] for r in first] == [urgent["id"]]
    for run in waiting:  # nothing more to learn from them
        lab_stack.post(f"/api/runs/{run['id']}/cancel")
    done = lab_stack.wait_status(urgent["id"], {"succeeded", "failed"}, timeout=240)
    assert done["status"] == "succeeded", done["error"]


# ---------------------------------------------------------------- fencing


def _trainer_pid(run_dir: str) -> int:
    return int(Path(run_dir, ".lock").read_text().strip())


def _assert_file_and_database_agree(stack, run: dict, total: int) -> None:
    file_steps = _file_steps(run["run_dir"])
    assert file_steps == list(range(total))  # no duplicated step in the file
    assert _steps(stack, run["id"]) == file_steps  # and the database holds exactly that


@pytest.mark.timeout(900)  # 60 steps and a hand-over: minutes when the CPU is shared
@ONE_BROKER
def test_frozen_worker_its_trainer_stops_before_the_run_moves_on(lab_stack):
    """SIGSTOP the worker alone: its trainer stops on the expired lease before the
    reconciler hands the run on; the next attempt resumes in the same folder."""
    total = 60  # long enough that the trainer cannot finish within its lease alone
    lab_stack.start_reconciler()
    lab_stack.start_worker("w1")
    run = _submit(lab_stack, **{"run.steps": total, "run.checkpoint_every": 2})
    lab_stack.wait_for(lambda: lab_stack.run(run["id"])["current_step"] >= 3, 240, "step 3")
    run_dir = lab_stack.run(run["id"])["run_dir"]
    trainer = _trainer_pid(run_dir)
    w1 = lab_stack.procs["w1"]
    lab_stack.freeze(w1.pid)
    try:
        lab_stack.start_worker("w2")
        done = lab_stack.wait_status(run["id"], {"succeeded", "failed"}, timeout=600)
    finally:
        os.kill(w1.pid, signal.SIGCONT)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] == 2 and done["worker_host"] == "w2@e2e"
    log = Path(run_dir, "trainer.log").read_text()
    first = log.split("=== attempt 2")[0]
    assert "lease" in first and "not renewed" in first  # attempt 1 stopped itself ...
    assert not Path(f"/proc/{trainer}").exists() or _is_zombie(trainer)  # ... and is gone
    time.sleep(2)  # the thawed worker finds its attempt lost and writes nothing
    _assert_file_and_database_agree(lab_stack, lab_stack.run(run["id"]), total)
    assert "lost" in lab_stack.log("w1")


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


@ONE_BROKER
def test_frozen_worker_and_trainer_never_share_the_folder_with_the_next_attempt(lab_stack):
    """SIGSTOP the worker and its trainer: the next attempt waits for the folder
    lock; thawed, the old trainer finds its lease expired and exits without
    writing, and the new one trains alone."""
    total = 12
    lab_stack.start_reconciler()
    lab_stack.start_worker("w1")
    run = _submit(lab_stack, **{"run.steps": total, "run.checkpoint_every": 2})
    lab_stack.wait_for(lambda: lab_stack.run(run["id"])["current_step"] >= 3, 240, "step 3")
    run_dir = lab_stack.run(run["id"])["run_dir"]
    trainer, w1 = _trainer_pid(run_dir), lab_stack.procs["w1"]
    lab_stack.freeze(trainer, w1.pid)
    try:
        lab_stack.start_worker("w2")
        lab_stack.wait_for(lambda: "still held; waiting" in lab_stack.log("w2"), 120, "w2 to wait")
        assert lab_stack.run(run["id"])["worker_host"] == "w2@e2e"
    finally:
        os.kill(trainer, signal.SIGCONT)
        os.kill(w1.pid, signal.SIGCONT)
    done = lab_stack.wait_status(run["id"], {"succeeded", "failed"}, timeout=300)
    assert done["status"] == "succeeded", done["error"]
    log = Path(run_dir, "trainer.log").read_text()
    assert "is in use by another trainer" not in log.split("=== attempt 2")[0]
    time.sleep(2)
    _assert_file_and_database_agree(lab_stack, lab_stack.run(run["id"]), total)


@ONE_BROKER
def test_cancel_during_the_warm_start_stops_within_seconds(lab_stack):
    lab_stack.start_worker("w1")
    run = _submit(
        lab_stack,
        **{"warm_start.max_steps": 100000, "warm_start.eval_every": 50000,
           "warm_start.target_accuracy_low": 0.99, "warm_start.target_accuracy_high": 1.0},
    )  # fmt: skip
    lab_stack.wait_status(run["id"], {"running"})
    run_dir = Path(lab_stack.run(run["id"])["run_dir"])
    lab_stack.wait_for(lambda: (run_dir / ".lock").exists(), 120, "the trainer to start")
    time.sleep(3)  # inside the warm start's SFT loop by now
    asked = time.monotonic()
    lab_stack.post(f"/api/runs/{run['id']}/cancel")
    done = lab_stack.wait_status(run["id"], {"cancelled", "succeeded", "failed"}, timeout=120)
    assert done["status"] == "cancelled", done["error"]
    assert time.monotonic() - asked < 15
    assert done["current_step"] == 0
