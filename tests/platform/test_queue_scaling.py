"""The queue and run lists cost the same few queries at 10 runs and at 200, and
their queue positions match the one-run ``queue_position``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from lab_processes import submit_tiny_run

from lab.jobs.queries import queue_position, queue_positions
from lab.runs.models import Run, RunStatus

# What the database itself decides (docs/design.md 4): also run on PostgreSQL.
pytestmark = pytest.mark.database

MAX_QUERIES = 8  # session/auth, count, page, positions (+ savepoints): never per row


def _fill(user, experiment, n: int) -> list[Run]:
    """``n`` runs over two queues: a fifth running, the rest queued, mixed priorities,
    some with the same creation time (their ids order them, as a worker claims them)."""
    template = submit_tiny_run(user, experiment)
    now = timezone.now()
    runs = []
    for i in range(n - 1):
        running = i % 5 == 0
        runs.append(
            Run(
                experiment=experiment, owner=user, config=template.config, seed=i,
                total_steps=template.total_steps, queue=("cpu", "gpu-a100")[i % 2],
                priority=i % 3,
                status=RunStatus.RUNNING if running else RunStatus.QUEUED,
                started_at=now - timedelta(seconds=30) if running else None,
                current_step=1 if running else 0,
            )
        )  # fmt: skip
    Run.objects.bulk_create(runs)
    Run.objects.filter(pk__in=[r.pk for r in runs[::7]]).update(created_at=now)
    return list(Run.objects.all())


@pytest.mark.parametrize("n", [10, 200])
def test_api_run_list_and_queue_do_not_grow_with_runs(
    api, user, experiment, n, django_assert_max_num_queries
):
    _fill(user, experiment, n)
    for url in ("/api/runs", "/api/queue"):
        with django_assert_max_num_queries(MAX_QUERIES):
            response = api.get(url)
        assert response.status_code == 200, url


@pytest.mark.parametrize("n", [10, 200])
def test_queue_page_and_runs_list_page_do_not_grow_with_runs(
    user, experiment, n, django_assert_max_num_queries
):
    _fill(user, experiment, n)
    browser = Client()
    browser.force_login(user)
    for url in ("/queue/", "/runs/"):
        with django_assert_max_num_queries(MAX_QUERIES + 4):  # the runs list's filter menus
            response = browser.get(url)
        assert response.status_code == 200, url


def test_bulk_positions_equal_one_run_positions(user, experiment):
    runs = _fill(user, experiment, 60)
    bulk = queue_positions(runs)
    assert bulk == {r.pk: queue_position(r) for r in runs if r.status == RunStatus.QUEUED}
    # Each queue's places are 1..n with no tie: the claim order (priority, age, id).
    for queue in ("cpu", "gpu-a100"):
        places = sorted(bulk[r.pk] for r in runs if r.pk in bulk and r.queue == queue)
        assert places == list(range(1, len(places) + 1))


def test_queue_api_is_paginated_with_a_bounded_limit(api, user, experiment):
    _fill(user, experiment, 30)
    body = api.get("/api/queue", {"limit": 10, "offset": 5}).json()
    assert body["count"] == 30 and len(body["runs"]) == 10 and body["next"]
    assert body["queues"] and body["runs"][0]["queue"] == "cpu"
    assert len(api.get("/api/queue", {"limit": 10**6}).json()["runs"]) == 30  # clamped, not 500
    for bad in ("1e20", "-1", "²", "0"):
        response = api.get("/api/runs", {"limit": bad})
        assert response.status_code == 400 and "limit" in response.json()["errors"], bad
    assert api.get("/api/runs", {"offset": "9" * 12}).status_code == 400


def test_queue_page_is_paginated(user, experiment):
    _fill(user, experiment, 130)
    browser = Client()
    browser.force_login(user)
    first = browser.get("/queue/").content.decode()
    assert "page 1 of 2" in first and first.count('<span class="status') == 100
    assert browser.get("/queue/", {"page": "²"}).status_code == 200


@pytest.mark.parametrize("n", [10, 200])
def test_experiment_lists_do_not_grow_with_experiments(api, user, n, django_assert_max_num_queries):
    from lab.experiments.models import Experiment

    Experiment.objects.bulk_create(
        Experiment(owner=user, name=f"e{i}", base_config={}) for i in range(n)
    )
    browser = Client()
    browser.force_login(user)
    with django_assert_max_num_queries(MAX_QUERIES):
        page = browser.get("/experiments/")
    assert page.status_code == 200
    with django_assert_max_num_queries(MAX_QUERIES):
        assert api.get("/api/experiments").status_code == 200
