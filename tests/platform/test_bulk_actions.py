"""Bulk actions (cancel selected, cancel a sweep, requeue) and the warning for a
queue no live worker serves, through the pages a researcher uses."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from lab.configs import resolve_config
from lab.jobs.models import Worker
from lab.runs import bulk, lifecycle, sweeps
from lab.runs.models import Run, RunStatus

# What the database itself decides (docs/design.md 4): also run on PostgreSQL.
pytestmark = pytest.mark.database


@pytest.fixture
def browser(user):
    client = Client()
    client.login(username="alice", password="pw-alice")
    return client


def _runs(user, experiment, tiny, n=3):
    return [
        lifecycle.submit_run(owner=user, experiment=experiment, preset="moe-grpo", overrides=tiny)
        for _ in range(n)
    ]


def test_cancel_selected_cancels_only_the_ticked_runs(browser, user, experiment, tiny):
    a, b, c = _runs(user, experiment, tiny)
    response = browser.post(
        "/runs/bulk", {"action": "cancel", "runs": [a.pk, c.pk], "next": "/runs/"}
    )
    assert response.status_code == 302 and response["Location"] == "/runs/"
    statuses = dict(Run.objects.values_list("pk", "status"))
    assert statuses == {a.pk: "cancelled", b.pk: "queued", c.pk: "cancelled"}


def test_bulk_cancel_leaves_other_peoples_runs(client, other_user, user, experiment, tiny):
    (mine,) = _runs(user, experiment, tiny, 1)
    outcome = bulk.cancel_runs([mine.pk], user=other_user)
    assert outcome.skipped == [mine.pk] and not outcome.done
    assert Run.objects.get(pk=mine.pk).status == RunStatus.QUEUED


def test_cancel_sweep_cancels_every_active_run_of_it(browser, user, experiment, tiny):
    base = resolve_config(preset="moe-grpo", overrides=tiny).to_dict()
    sweep = sweeps.create_sweep(
        owner=user, experiment=experiment, base_config=base, grid={}, seeds=[0, 1, 2]
    )
    (outside,) = _runs(user, experiment, tiny, 1)
    browser.post(f"/sweeps/{sweep.pk}/cancel", {"next": "/queue/"})
    assert set(sweep.runs.values_list("status", flat=True)) == {"cancelled"}
    assert Run.objects.get(pk=outside.pk).status == "queued"


def test_requeue_puts_a_cancelled_run_back_and_keeps_fencing(browser, user, experiment, tiny):
    (run,) = _runs(user, experiment, tiny, 1)
    Run.objects.filter(pk=run.pk).update(status="cancelled", attempts=2, error="stopped")
    response = browser.post(f"/runs/{run.pk}/requeue")
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == "queued" and not run.cancel_requested and run.error == ""
    # attempts keeps counting (a late write of attempt 2 stays fenced out), with a new allowance
    assert run.attempts == 2 and run.max_attempts > 2


def test_requeue_refuses_a_queued_run(user, experiment, tiny):
    (run,) = _runs(user, experiment, tiny, 1)
    with pytest.raises(lifecycle.InvalidState):
        bulk.requeue_run(run, user=user)


def test_queue_page_warns_when_no_live_worker_serves_a_waiting_queue(
    browser, user, experiment, tiny
):
    _runs(user, experiment, tiny, 1)
    page = browser.get("/queue/").content.decode()
    assert "No live worker serves cpu; runs here wait" in page
    Worker.objects.create(hostname="cpu0@test", queues=["cpu"], last_seen=timezone.now())
    page = browser.get("/queue/").content.decode()
    assert "No live worker serves cpu" not in page


def test_submitting_to_an_unserved_queue_says_so(browser, experiment):
    response = browser.post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "config_json": "{}", "queue": "gpu-a100", "priority": "0"},
        follow=True,
    )
    assert "No live worker serves gpu-a100; runs here wait" in response.content.decode()


def test_runs_list_offers_new_run_and_bulk_actions(browser, experiment):
    page = browser.get("/runs/").content.decode()
    assert "New run" in page and "Cancel selected" in page and "Requeue selected" in page
    response = browser.get(f"/runs/new?into={experiment.pk}")
    assert response["Location"] == f"/experiments/{experiment.pk}/runs/new"


def test_the_sweep_page_offers_cancel_sweep(browser, user, experiment, tiny):
    base = resolve_config(preset="moe-grpo", overrides=tiny).to_dict()
    sweep = sweeps.create_sweep(
        owner=user, experiment=experiment, base_config=base, grid={}, seeds=[0, 1]
    )
    page = browser.get(f"/sweeps/{sweep.pk}/").content.decode()
    assert f'action="/sweeps/{sweep.pk}/cancel"' in page and "Cancel sweep" in page
