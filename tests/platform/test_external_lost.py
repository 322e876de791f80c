"""Stuck states end: an external run that sends nothing for LAB_EXTERNAL_LOST_AFTER_S
becomes ``lost`` (the reconciler marks it), is left out of the stability review as
censored-unknown and says so on its page; it is running again if it reports again,
and its owner can end it from its page. (A verl job killed without end_run once
stayed running for ever and counted as a surviving seed.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from test_tracking_api import Mlflow

from dashboard.review.seeds import split_seeds
from lab.jobs import tasks
from lab.runs.lifecycle import mark_lost_external_runs
from lab.runs.models import Run, RunStatus


@pytest.fixture
def ml(user):
    return Mlflow(user)


def _external(ml, name="verl-seed-0") -> Run:
    experiment = ml.ok("POST", "experiments/create", {"name": f"ext-{name}"})["experiment_id"]
    run_id = ml.run(experiment, name)
    ml.ok("POST", "runs/log-metric", {"run_id": run_id, "key": "critic/score/mean", "value": 0.5,
                                      "timestamp": 1, "step": 3})  # fmt: skip
    return Run.objects.get(pk=run_id)


def _silent_for(run: Run, seconds: float) -> None:
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def test_a_silent_external_run_becomes_lost_and_a_report_revives_it(ml, user, experiment):
    from lab_processes import submit_tiny_run

    run = _external(ml)
    quiet = _external(ml, "still-talking")
    lab_run = submit_tiny_run(user, experiment)
    Run.objects.filter(pk=lab_run.pk).update(
        status=RunStatus.RUNNING, heartbeat_at=timezone.now() - timedelta(hours=5)
    )
    _silent_for(run, 7200)
    assert mark_lost_external_runs(3600) == [run.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.LOST and "sent nothing for 3600 s" in run.error
    assert Run.objects.get(pk=quiet.pk).status == RunStatus.RUNNING
    assert Run.objects.get(pk=lab_run.pk).status == RunStatus.RUNNING  # the worker's business
    # MLflow clients still read it (MLflow has no "lost": it has not ended) ...
    got = ml.ok("GET", "runs/get", {"run_id": str(run.pk)})
    assert got["run"]["info"]["status"] == "RUNNING"
    # ... and a report makes it running again.
    ml.ok("POST", "runs/log-metric", {"run_id": str(run.pk), "key": "loss", "value": 1.0,
                                      "timestamp": 2, "step": 4})  # fmt: skip
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.error == ""
    assert mark_lost_external_runs(3600) == []  # it just reported


def test_the_reconciler_marks_lost_runs(ml, settings):
    run = _external(ml)
    settings.LAB_EXTERNAL_LOST_AFTER_S = 60
    _silent_for(run, 120)
    tasks.reconcile()
    assert Run.objects.get(pk=run.pk).status == RunStatus.LOST


def test_a_lost_run_is_never_a_seed(ml):
    lost, alive = _external(ml, "a"), _external(ml, "b")
    Run.objects.filter(pk=lost.pk).update(status=RunStatus.LOST)
    runs = list(Run.objects.filter(pk__in=[lost.pk, alive.pk]).order_by("pk"))
    for include_stopped in (False, True):
        seeds, left_out = split_seeds(runs, include_stopped=include_stopped)
        assert [r.pk for r in seeds] == [alive.pk] and [r.pk for r in left_out] == [lost.pk]


def test_the_pages_show_a_lost_run_and_its_owner_ends_it(ml, user, other_user):
    run = _external(ml)
    _silent_for(run, 7200)
    mark_lost_external_runs(3600)
    owner = Client()
    owner.login(username="alice", password="pw-alice")
    page = owner.get(f"/runs/{run.pk}/").content.decode()
    assert 'class="status lost"' in page and 'data-field="lost"' in page
    assert 'data-action="end-run"' in page
    review = owner.get(f"/stability/?experiment={run.experiment_id}").content.decode()
    assert f"#{run.pk} (lost)" in review and "Lost runs" in review
    # Someone else cannot end it; the owner can.
    stranger = Client()
    stranger.login(username="bob", password="pw-bob")
    assert stranger.post(f"/runs/{run.pk}/end", {"status": "failed"}).status_code == 403
    assert owner.post(f"/runs/{run.pk}/end", {"status": "nonsense"}).status_code == 302
    assert Run.objects.get(pk=run.pk).status == RunStatus.LOST
    assert owner.post(f"/runs/{run.pk}/end", {"status": "failed"}).status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.finished_at is not None
    assert 'data-action="end-run"' not in owner.get(f"/runs/{run.pk}/").content.decode()


def test_the_owner_ends_a_running_external_run_as_succeeded_and_it_is_judged(ml, user):
    run = _external(ml)
    owner = Client()
    owner.login(username="alice", password="pw-alice")
    owner.post(f"/runs/{run.pk}/end", {"status": "succeeded"})
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.summary is not None
    assert "collapsed" in run.summary
