"""Deleting a run is soft, as MLflow's DeleteRun: it leaves every page but keeps its
metrics, and its owner (or staff) restores it from the experiment page."""

from __future__ import annotations

import pytest
from django.utils import timezone
from teams import share

from lab.runs.models import MetricStep, Run, RunStatus
from tests.dashboard.conftest import records


@pytest.fixture
def finished(make_run):
    return make_run(variant="moe-grpo", records=records(5, **{"reward/accuracy": lambda s: 0.5}))


def test_a_deleted_run_leaves_the_pages_keeps_its_metrics_and_comes_back(alice, finished):
    stored = MetricStep.objects.filter(run_id=finished.pk).count()
    page = alice.post(f"/runs/{finished.pk}/delete")
    assert page.status_code == 302 and page.url == f"/experiments/{finished.experiment_id}/"
    assert alice.get(f"/runs/{finished.pk}/").status_code == 404
    assert not Run.objects.filter(pk=finished.pk).exists()
    kept = Run.all_objects.get(pk=finished.pk)
    assert kept.deleted_at is not None and kept.status == RunStatus.SUCCEEDED
    assert MetricStep.objects.filter(run_id=finished.pk).count() == stored > 0
    html = alice.get(f"/experiments/{finished.experiment_id}/").content.decode()
    assert f'data-deleted-run="{finished.pk}"' in html
    assert f'action="/runs/{finished.pk}/restore"' in html
    back = alice.post(f"/runs/{finished.pk}/restore")
    assert back.status_code == 302 and back.url == f"/runs/{finished.pk}/"
    assert Run.objects.get(pk=finished.pk).deleted_at is None
    html = alice.get(f"/experiments/{finished.experiment_id}/").content.decode()
    assert "data-deleted-run" not in html


def test_only_the_owner_or_staff_restores(alice, client_for, other_user, finished):
    alice.post(f"/runs/{finished.pk}/delete")
    share(finished.experiment, other_user)
    bob = client_for(other_user)
    html = bob.get(f"/experiments/{finished.experiment_id}/").content.decode()
    assert f'data-deleted-run="{finished.pk}"' in html
    assert f'action="/runs/{finished.pk}/restore"' not in html  # no button for a teammate
    assert bob.post(f"/runs/{finished.pk}/restore").status_code == 403
    assert Run.all_objects.get(pk=finished.pk).deleted_at is not None


def test_a_waiting_run_is_cancelled_as_it_is_deleted(alice, make_run):
    waiting = make_run(status=RunStatus.QUEUED)
    alice.post(f"/runs/{waiting.pk}/delete")
    kept = Run.all_objects.get(pk=waiting.pk)
    assert kept.status == RunStatus.CANCELLED and kept.cancel_requested
    assert kept.deleted_at is not None


def test_a_training_run_is_not_deleted(alice, make_run):
    training = make_run(status=RunStatus.RUNNING)
    alice.post(f"/runs/{training.pk}/delete")
    assert Run.objects.get(pk=training.pk).deleted_at is None


def test_restore_waits_for_a_deleted_experiment(alice, finished):
    alice.post(f"/runs/{finished.pk}/delete")
    experiment = finished.experiment
    experiment.deleted_at = timezone.now()
    experiment.save(update_fields=["deleted_at"])
    alice.post(f"/runs/{finished.pk}/restore")
    assert Run.all_objects.get(pk=finished.pk).deleted_at is not None


def test_the_api_delete_is_soft_too(client_for, user, finished):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(user)
    assert api.delete(f"/api/runs/{finished.pk}").status_code == 204
    assert api.get(f"/api/runs/{finished.pk}").status_code == 404
    assert Run.all_objects.get(pk=finished.pk).deleted_at is not None
