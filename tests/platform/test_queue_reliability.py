"""The queue never loses, never doubles and keeps priorities (without workers:
the services, the supervisor's failure paths and the submit API)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from lab_processes import submit_tiny_run
from teams import share

from lab.jobs import queries, spawn, supervisor, tasks, watch
from lab.jobs import services as jobs
from lab.runs.metrics.ingest import StaleAttempt, drop_metrics_after, ingest_metrics
from lab.runs.models import MetricStep, Run, RunStatus
from lab.site.celery import app

# What the database itself decides (docs/design.md 4): also run on PostgreSQL.
pytestmark = pytest.mark.database


@pytest.fixture
def queue(settings):
    """A queue of this test's own: no other test's runs or broker messages in it."""
    name = f"q-{uuid.uuid4().hex[:8]}"
    settings.LAB_QUEUES = [*settings.LAB_QUEUES, name]
    return name


def _stored_steps(run_id: int) -> list[int]:
    return list(MetricStep.objects.filter(run_id=run_id).values_list("step", flat=True))


# ------------------------------------------------------------------ claim order


def test_priority_9_submitted_behind_20_queued_runs_is_claimed_next(
    user, staff_user, experiment, queue
):
    waiting = [submit_tiny_run(user, experiment, queue=queue) for _ in range(20)]
    urgent = submit_tiny_run(staff_user, experiment, queue=queue, priority=9)  # above 5: staff
    assert queries.queue_position(urgent) == 1
    # The wake-up that arrives first is the oldest run's; the database still picks.
    claim = jobs.claim_next(queue, worker_host="w1")
    assert claim.run_id == urgent.pk
    started = [jobs.claim_next(queue, worker_host="w1").run_id for _ in range(3)]
    assert started == [r.pk for r in waiting[:3]]


def test_claim_order_is_the_queue_position_shown(staff_user, experiment, queue):
    runs = [
        submit_tiny_run(staff_user, experiment, queue=queue, priority=p) for p in (0, 5, 0, 9, 5, 0)
    ]
    by_position = sorted(runs, key=queries.queue_position)
    claimed = [jobs.claim_next(queue, worker_host="w").run_id for _ in runs]
    assert claimed == [r.pk for r in by_position]
    assert jobs.claim_next(queue, worker_host="w") is None  # a spare wake-up is a no-op


def test_a_wake_up_for_a_taken_run_claims_the_next_or_nothing(user, experiment, queue):
    first = submit_tiny_run(user, experiment, queue=queue)
    second = submit_tiny_run(user, experiment, queue=queue)
    assert jobs.claim_run(first.pk, worker_host="w1").run_id == first.pk
    # A duplicate message for `first`: the next queued run of its queue.
    assert supervisor.claim_for_wake_up(first.pk, worker_host="w2").run_id == second.pk
    assert supervisor.claim_for_wake_up(first.pk, worker_host="w2") is None


def test_each_claim_is_a_new_fencing_token(user, experiment, queue):
    run = submit_tiny_run(user, experiment, queue=queue)
    claims = []
    for _ in range(3):
        claims.append(jobs.claim_next(queue, worker_host="w"))
        Run.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED)  # requeued
    assert [c.attempt for c in claims] == [1, 2, 3]


# ------------------------------------------------------------------ re-publishing


def test_reconciler_republishes_queued_runs_the_broker_lost(
    user, experiment, queue, django_capture_on_commit_callbacks
):
    old = [submit_tiny_run(user, experiment, queue=queue) for _ in range(3)]
    young = submit_tiny_run(user, experiment, queue=queue)
    long_ago = timezone.now() - timedelta(seconds=600)
    Run.objects.filter(pk__in=[r.pk for r in old]).update(published_at=long_ago)
    # The broker holds no message for this queue (its data was lost).
    with django_capture_on_commit_callbacks() as published:
        actions = jobs.republish_queued_runs(60)
    assert sorted(a.run_id for a in actions) == sorted(r.pk for r in old)
    assert {a.action for a in actions} == {"republished"}
    assert len(published) == 3 and young.pk not in [a.run_id for a in actions]
    # Published just now: the next tick leaves them alone.
    with django_capture_on_commit_callbacks() as published:
        assert jobs.republish_queued_runs(60) == []
    assert not published


def test_reconciler_republishes_only_what_waiting_messages_do_not_cover(
    user, experiment, queue, django_capture_on_commit_callbacks
):
    runs = [submit_tiny_run(user, experiment, queue=queue) for _ in range(3)]
    app.send_task("jobs.tasks.execute_run", args=[runs[0].pk], queue=queue)  # one survived
    Run.objects.filter(queue=queue).update(published_at=timezone.now() - timedelta(seconds=600))
    try:
        with django_capture_on_commit_callbacks():
            actions = jobs.republish_queued_runs(60)
        assert len(actions) == 2
        assert [a.run_id for a in actions] == [runs[0].pk, runs[1].pk]  # claim order
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(queue)


# ------------------------------------------------------------------ fencing


def test_metrics_from_a_stale_attempt_are_refused_in_the_same_transaction(user, experiment):
    run = submit_tiny_run(user, experiment)
    first = jobs.claim_run(run.pk, worker_host="w1")
    assert ingest_metrics(run.pk, [{"step": 0, "x": 1.0}], attempt=first.attempt) == 1
    Run.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED)  # the reconciler requeued
    second = jobs.claim_run(run.pk, worker_host="w2")
    with pytest.raises(StaleAttempt):
        ingest_metrics(run.pk, [{"step": 1, "x": 2.0}], attempt=first.attempt)
    with pytest.raises(StaleAttempt):
        drop_metrics_after(run.pk, -1, attempt=first.attempt)
    assert _stored_steps(run.pk) == [0]
    assert ingest_metrics(run.pk, [{"step": 1, "x": 2.0}], attempt=second.attempt) == 1
    jobs.finish_run(second, status="succeeded", summary=None)
    with pytest.raises(StaleAttempt):  # finished: nobody writes any more
        ingest_metrics(run.pk, [{"step": 2, "x": 3.0}], attempt=second.attempt)


def test_trainer_command_carries_the_attempts_lease(tmp_path):
    lease = spawn.lease_file(tmp_path, 3)
    cmd = spawn.trainer_command(
        tmp_path / "config.json", tmp_path, resume=False, gpus=1, lease=lease, lease_s=2.5
    )
    assert cmd[cmd.index("--lease-file") + 1] == str(tmp_path / ".lease-attempt-3")
    assert cmd[cmd.index("--lease-s") + 1] == "2.5"
    assert spawn.lease_file(tmp_path, 4) != lease


def test_a_leftover_checkpoint_temporary_is_not_a_checkpoint(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt.host-123.tmp").write_bytes(b"half")
    assert not spawn.has_checkpoint(tmp_path)
    (tmp_path / "checkpoints" / "last.pt").write_bytes(b"whole")
    assert spawn.has_checkpoint(tmp_path)


# ------------------------------------------------------------------ clear failures


def test_reconciler_fails_a_run_with_the_metrics_file_ingested(user, experiment, tmp_path):
    run = submit_tiny_run(user, experiment)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    Run.objects.filter(pk=run.pk).update(max_attempts=1, run_dir=str(run_dir))
    claim = jobs.claim_run(run.pk, worker_host="w1")
    ingest_metrics(run.pk, [{"step": s, "x": float(s)} for s in range(3)], attempt=claim.attempt)
    # The worker died after the trainer wrote two more steps (and half a line).
    lines = [json.dumps({"step": s, "x": float(s)}) for s in range(5)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 5, "x"')
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=600))
    actions = jobs.reconcile_stale_runs(60)
    assert [(a.run_id, a.action) for a in actions] == [(run.pk, "failed")]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.current_step == 5
    assert _stored_steps(run.pk) == [0, 1, 2, 3, 4]


def test_reconciler_ends_a_lost_run_whose_cancel_was_asked_for(user, experiment):
    run = submit_tiny_run(user, experiment)
    jobs.claim_run(run.pk, worker_host="w1")
    Run.objects.filter(pk=run.pk).update(
        cancel_requested=True, heartbeat_at=timezone.now() - timedelta(seconds=600)
    )
    actions = jobs.reconcile_stale_runs(60)
    assert [(a.run_id, a.action) for a in actions] == [(run.pk, "cancelled")]
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_unwritable_run_folder_fails_at_once_with_the_os_error(user, experiment, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the runs folder should be")
    run = submit_tiny_run(user, experiment)
    Run.objects.filter(pk=run.pk).update(run_dir=str(blocker / "run-1"))
    claim = jobs.claim_run(run.pk, worker_host="w1")
    assert supervisor.execute_claim(claim) == RunStatus.FAILED
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.attempts == 1
    assert "cannot use the run folder" in run.error and "Not a directory" in run.error


def test_claim_retry_backs_off_up_to_a_minute():
    assert [tasks.claim_retry_delay(n) for n in (0, 1, 2, 3, 10)] == [1, 2, 4, 8, 60]


# ------------------------------------------------------------------ submit


def _submit(api, experiment, queue, key: str | None = None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    payload = {
        "experiment": experiment.pk,
        "preset": "moe-grpo",
        "overrides": {"run.steps": 3},
        "queue": queue,
    }
    return api.post("/api/runs", payload, format="json", **headers)


def test_a_retried_submit_with_its_idempotency_key_returns_the_same_run(
    api, other_api, other_user, experiment, queue
):
    first = _submit(api, experiment, queue, key="submit-42")
    again = _submit(api, experiment, queue, key="submit-42")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert Run.objects.filter(queue=queue).count() == 1
    # Keys are per owner; no key means a new run every time.
    share(experiment, other_user)  # a teammate may queue into the experiment
    assert _submit(other_api, experiment, queue, key="submit-42").json()["id"] != first.json()["id"]
    assert _submit(api, experiment, queue).json()["id"] != first.json()["id"]
    too_long = _submit(api, experiment, queue, key="k" * 201)
    assert too_long.status_code == 400 and "Idempotency-Key" in too_long.json()["errors"]


@pytest.fixture
def broker_down():
    """The Celery app pointed at a port where no broker listens."""
    old = app.conf.broker_url
    app.conf.broker_url = "redis://127.0.0.1:9/0"
    app._pool = None
    app.amqp._producer_pool = None
    try:
        yield
    finally:
        app.conf.broker_url = old
        app._pool = None
        app.amqp._producer_pool = None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_submit_while_the_broker_is_down_answers_503_and_keeps_the_run_for_later(
    api, experiment, queue, broker_down
):
    down = _submit(api, experiment, queue, key="retry-me")
    assert down.status_code == 503
    body = down.json()
    assert "unreachable" in body["detail"] and body["run"]["status"] == "queued"
    retry = _submit(api, experiment, queue, key="retry-me")  # the client's retry
    assert retry.status_code == 200 and retry.json()["id"] == body["run"]["id"]
    assert Run.objects.filter(queue=queue).count() == 1
    # The other ways in (form, clone, sweeps) store the run and leave it to the reconciler.
    later = submit_tiny_run(experiment.owner, experiment, queue=queue)
    assert later.status == RunStatus.QUEUED and Run.objects.filter(queue=queue).count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_wake_up_that_cannot_reach_the_database_goes_back_to_the_broker(user, queue):
    """The database fails before the claim: the task asks Celery to retry (a new
    message, later) instead of failing, which Celery would acknowledge away."""
    from celery.exceptions import Retry
    from django.db import OperationalError, connection

    from lab.experiments.services import create_experiment
    from lab.runs.dispatch import waiting_messages

    experiment = create_experiment(owner=user, name="db down", preset="moe-grpo")
    run = submit_tiny_run(user, experiment, queue=queue)
    with app.connection_for_write() as conn:  # this wake-up is the one being delivered
        conn.default_channel.queue_purge(queue)

    def database_unreachable(execute, sql, params, many, context):
        raise OperationalError("could not connect to server: Connection refused")

    # As a worker delivers it: a task id and the queue it came from.
    route = {"exchange": queue, "routing_key": queue}
    tasks.execute_run.push_request(
        id="wake-1", args=[run.pk], kwargs={}, delivery_info=route, called_directly=False
    )
    try:
        with connection.execute_wrapper(database_unreachable), pytest.raises(Retry):
            tasks.execute_run.run(run.pk)
        assert waiting_messages(queue) == 1  # the retry, due in a second
        run.refresh_from_db()
        assert run.status == RunStatus.QUEUED and run.attempts == 0
    finally:
        tasks.execute_run.pop_request()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(queue)


@pytest.mark.slow
def test_a_trainer_that_finds_the_folder_held_sends_the_run_back_to_the_queue(
    user, experiment, tmp_path, settings, django_capture_on_commit_callbacks
):
    """An earlier attempt's trainer still holds the folder after the wait: the
    new trainer (the real CLI) exits at once, the run goes back to the queue
    with the reason, and fails with it once attempts run out."""
    from trainer.run_folder.guard import RunDirLock

    settings.LAB_STALE_AFTER_S = 0.5  # the supervisor waits 2 x this for the folder
    run = submit_tiny_run(user, experiment)
    Run.objects.filter(pk=run.pk).update(run_dir=str(tmp_path / "run"), max_attempts=2)
    with RunDirLock(tmp_path / "run"):  # the earlier attempt's trainer, still alive
        first = jobs.claim_run(run.pk, worker_host="w1")
        with django_capture_on_commit_callbacks() as published:
            assert supervisor.execute_claim(first) == "requeued"
        run.refresh_from_db()
        assert run.status == RunStatus.QUEUED and len(published) == 1
        assert "held by another trainer" in run.error
        second = jobs.claim_run(run.pk, worker_host="w1")
        assert supervisor.execute_claim(second) == RunStatus.FAILED
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "is in use by another trainer" in run.error
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert not list((tmp_path / "run").glob(".lease-attempt-*"))  # each attempt cleans up


def test_a_database_error_in_the_watch_loop_is_retried_not_fatal(
    transactional_db, user, experiment, tmp_path, monkeypatch, settings, caplog
):
    """The database ends the worker's session mid-run (PostgreSQL's idle-transaction
    timeout after a freeze, a restart): the loop drops the connection, keeps the
    metric lines it could not store and stores them on the next pass, does not
    renew the lease meanwhile, and goes on supervising the trainer. Not inside
    the test's wrapping transaction: the loop closes the connection, as the
    worker does."""
    import subprocess
    import sys

    from django.db import OperationalError

    from lab.jobs.tailer import MetricsTail

    settings.LAB_POLL_S = 0.05
    settings.LAB_HEARTBEAT_S = 0.05
    run = submit_tiny_run(user, experiment)
    claim = jobs.claim_run(run.pk, worker_host="w1")
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 0, "x": 1.0}) + "\n")
    lease = tmp_path / ".lease"
    lease.write_text("")
    failures = {"ingest": 1, "heartbeat": 2}
    real_ingest, real_heartbeat = watch.ingest_metrics, jobs.heartbeat

    def flaky(name, real):
        def call(*args, **kwargs):
            if failures[name]:
                failures[name] -= 1
                raise OperationalError("terminating connection due to idle-in-transaction timeout")
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(watch, "ingest_metrics", flaky("ingest", real_ingest))
    monkeypatch.setattr(jobs, "heartbeat", flaky("heartbeat", real_heartbeat))
    renewed = []
    monkeypatch.setattr(watch, "renew_lease", lambda path: renewed.append(time.monotonic()))
    sup = watch.Supervision(claim=claim, run_dir=tmp_path, tail=MetricsTail(metrics), lease=lease)
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    with caplog.at_level("WARNING"):
        assert watch.watch(trainer, sup) == 0
    assert _stored_steps(run.pk) == [0] and sup.pending == []  # stored on the retry
    assert failures == {"ingest": 0, "heartbeat": 0}
    assert renewed  # once the database answered again, the lease was renewed
    assert (
        sum("database unreachable" in r.getMessage() for r in caplog.records) == 1
    )  # rate-limited
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING
