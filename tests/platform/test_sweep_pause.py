"""The demo yields: it queues at the lowest priority, so a user's run starts
first, and its sweep (any sweep) can be paused, resumed or cleared without
touching its finished runs (lab.runs.bulk, lab.runs.demo)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from lab_processes import TINY_OVERRIDES, submit_tiny_run

from lab.configs import resolve_config
from lab.jobs import queries
from lab.jobs import services as jobs
from lab.runs import bulk, lifecycle
from lab.runs.demo import DEMO_PRIORITY, DEMO_USER, queue_demo
from lab.runs.metrics.ingest import ingest_metrics
from lab.runs.models import Run, RunStatus
from lab.runs.sweeps import create_sweep

# What the database itself decides (docs/design.md 4): also run on PostgreSQL.
pytestmark = pytest.mark.database


@pytest.fixture
def demo(db):
    owner = get_user_model().objects.create_superuser(DEMO_USER, password="pw-demo")
    sweep = queue_demo(owner, queue="cpu", steps=3)
    return sweep


def test_a_users_run_submitted_after_the_demo_is_claimed_before_it(demo, user, experiment):
    assert {r.priority for r in demo.runs.all()} == {DEMO_PRIORITY}
    mine = submit_tiny_run(user, experiment)  # no priority given: the default
    assert mine.priority == lifecycle.DEFAULT_PRIORITY > DEMO_PRIORITY
    assert queries.queue_position(mine) == 1
    claim = jobs.claim_next("cpu", worker_host="w1")
    assert claim.run_id == mine.pk
    # Then the demo, oldest first (seed-major, as queued).
    first_demo = demo.runs.order_by("created_at", "pk").first()
    assert jobs.claim_next("cpu", worker_host="w2").run_id == first_demo.pk


def _sweep_in_three_states(user, experiment):
    """A sweep of three runs: one finished (with stored metrics), one training, one waiting."""
    base = resolve_config(preset="moe-grpo", overrides=TINY_OVERRIDES).to_dict()
    sweep = create_sweep(owner=user, experiment=experiment, base_config=base,
                         grid={}, seeds=[0, 1, 2], queue="cpu")  # fmt: skip
    done, training, waiting = sweep.runs.order_by("pk")
    ingest_metrics(done.pk, [{"step": 0, "reward/mean": 0.5}])
    Run.objects.filter(pk=done.pk).update(status=RunStatus.SUCCEEDED, current_step=1)
    claim = jobs.claim_run(training.pk, worker_host="w1")
    return sweep, done, training, waiting, claim


def test_pause_holds_the_waiting_and_stops_the_training_keeping_the_finished(user, experiment):
    sweep, done, training, waiting, claim = _sweep_in_three_states(user, experiment)
    other = submit_tiny_run(user, experiment)

    outcome = bulk.pause_sweep(sweep, user=user)

    assert sorted(outcome.done) == [training.pk, waiting.pk]
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.QUEUED and waiting.waits_paused
    assert jobs.stop_requested(claim) == "pause"  # its worker stops the trainer
    kept = Run.objects.get(pk=done.pk)
    assert kept.status == RunStatus.SUCCEEDED and not kept.paused and kept.current_step == 1
    # Held runs have no place in the queue and are never claimed.
    assert queries.queue_position(waiting) is None
    assert queries.queue_positions([waiting, other]) == {other.pk: 1}
    assert queries.queue_position(other) == 1
    assert "paused" in queries.waiting_reason(waiting)
    assert "paused in cpu" in queries.placement_text(waiting)
    assert jobs.claim_next("cpu", worker_host="w2").run_id == other.pk
    assert jobs.claim_next("cpu", worker_host="w3") is None
    assert jobs.claim_run(waiting.pk, worker_host="w3") is None
    assert jobs.republish_queued_runs(republish_after_s=-1) == []


def test_resume_queues_the_paused_runs_again_with_a_wake_up(
    user, experiment, django_capture_on_commit_callbacks
):
    sweep, _done, _training, waiting, _claim = _sweep_in_three_states(user, experiment)
    bulk.pause_sweep(sweep, user=user)
    with django_capture_on_commit_callbacks(execute=False) as published:
        outcome = bulk.resume_sweep(sweep, user=user)
    assert waiting.pk in outcome.done
    assert len(published) == 1  # the waiting run's wake-up (the training one was never held)
    assert not Run.objects.filter(sweep=sweep, paused=True).exists()
    assert jobs.claim_next("cpu", worker_host="w2").run_id == waiting.pk


def test_clear_deletes_the_waiting_cancels_the_training_and_keeps_the_finished(user, experiment):
    sweep, done, training, waiting, claim = _sweep_in_three_states(user, experiment)
    outcome = bulk.clear_sweep(sweep, user=user)
    assert sorted(outcome.done) == [training.pk, waiting.pk]
    assert not Run.objects.filter(pk=waiting.pk).exists()
    assert jobs.stop_requested(claim) == "cancel"
    kept = Run.objects.get(pk=done.pk)
    assert kept.status == RunStatus.SUCCEEDED and kept.current_step == 1


def test_only_the_owner_or_staff_pause_or_clear_a_sweep(user, other_user, experiment):
    sweep, *_ = _sweep_in_three_states(user, experiment)
    for action in (bulk.pause_sweep, bulk.clear_sweep, bulk.resume_sweep):
        outcome = action(sweep, user=other_user)
        assert outcome.done == []
    assert not Run.objects.filter(sweep=sweep, paused=True).exists()
    assert sweep.runs.count() == 3


def test_the_queue_page_pauses_and_clears_the_demo_in_one_click(demo, user, experiment):
    mine = submit_tiny_run(user, experiment)
    browser = Client()
    browser.force_login(get_user_model().objects.get(username=DEMO_USER))
    page = browser.get("/queue/").content.decode()
    assert 'id="demo-queue"' in page and "priority 0, the lowest" in page
    assert "Pause the demo" in page and "Clear the demo" in page

    paused = browser.post(f"/sweeps/{demo.pk}/pause", {"next": "/queue/"}, follow=True)
    assert f"Sweep {demo.pk}: paused 12 runs" in paused.content.decode()
    assert demo.runs.filter(paused=True).count() == 12
    assert "Resume the demo" in paused.content.decode()
    assert jobs.claim_next("cpu", worker_host="w1").run_id == mine.pk
    assert jobs.claim_next("cpu", worker_host="w1") is None

    cleared = browser.post(f"/sweeps/{demo.pk}/clear", {"next": "/queue/"}, follow=True)
    assert f"Sweep {demo.pk}: cleared 12 runs" in cleared.content.decode()
    assert demo.runs.count() == 0 and Run.objects.filter(pk=mine.pk).exists()


def test_the_api_pauses_resumes_and_clears_a_sweep(api, other_api, user, experiment):
    sweep, done, training, waiting, _claim = _sweep_in_three_states(user, experiment)
    assert other_api.post(f"/api/sweeps/{sweep.pk}/pause").json()["done"] == []
    body = api.post(f"/api/sweeps/{sweep.pk}/pause").json()
    assert body["action"] == "pause" and sorted(body["done"]) == [training.pk, waiting.pk]
    assert api.get(f"/api/runs/{waiting.pk}").json()["paused"] is True
    assert api.post(f"/api/sweeps/{sweep.pk}/resume").json()["done"]
    assert api.get(f"/api/runs/{waiting.pk}").json()["paused"] is False
    assert api.post(f"/api/sweeps/{sweep.pk}/clear").json()["done"]
    assert sorted(sweep.runs.values_list("pk", flat=True)) == [done.pk, training.pk]
    assert api.post("/api/sweeps/999999/pause").status_code == 404


def test_an_api_sweep_takes_a_priority(api, experiment):
    made = api.post(
        "/api/sweeps",
        {"experiment": experiment.pk, "preset": "moe-grpo", "grid": {"run.steps": [3]},
         "seeds": [0], "priority": 3},
        format="json",
    )  # fmt: skip
    assert made.status_code == 201, made.content
    assert Run.objects.get(pk=made.json()["runs"][0]).priority == 3
