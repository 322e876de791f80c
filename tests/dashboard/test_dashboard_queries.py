"""The number of DB queries of a page or chart endpoint does not grow with the
number of runs it shows: metric reads are one query per run set (no N+1)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard.review import services
from lab.runs.models import RunStatus
from tests.dashboard.conftest import records


def _metrics(seed: int) -> list[dict]:
    return records(
        20,
        reward__accuracy=lambda s: 0.5,
        mismatch__kl_k3=lambda s: 1e-3 * (seed + 1),
        mismatch__routing_inconsistency=lambda s: 0.1,
        mismatch__extreme_token_frac=lambda s: 0.01,
        experts__load__L0=lambda s: [0.25] * 4,
    )


@pytest.fixture
def run_sets(make_run, user, other_user):
    """Two sets of runs in the same experiment: a small one and a large one, with
    verdicts, collapses and both owners, so every per-run lookup is exercised."""

    def build(n: int, tag: str) -> list[int]:
        ids = []
        for i in range(n):
            run = make_run(
                variant=f"{tag}-{i % 2}",
                seed=i,
                records=_metrics(i),
                owner=user if i % 2 else other_user,
                status=RunStatus.RUNNING if i == 0 else RunStatus.SUCCEEDED,
                summary={"collapsed": i % 3 == 0, "collapse_step": 10, "collapse_reason": "nan"},
            )
            services.set_verdict(author=user, run=run, label="stable")
            ids.append(run.pk)
        return ids

    return build(2, "small"), build(8, "large")


def _queries(client, url: str, query: dict) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, query)
    assert response.status_code == 200, response.content[:500]
    return len(ctx)


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids))


@pytest.mark.parametrize(
    "url, query",
    [
        ("/compare/", {}),
        ("/compare/chart", {"key": "reward/accuracy"}),
        ("/compare/charts", {"keys": "reward/accuracy,mismatch/kl_k3,eval/accuracy"}),
        ("/stability/", {}),
        ("/stability/chart/collapse", {}),
        ("/stability/chart/survival", {}),
        ("/stability/table", {"format": "csv"}),
    ],
)
def test_run_set_views_do_not_grow_with_runs(
    alice, run_sets, url, query, django_assert_num_queries
):
    small, large = run_sets
    expected = _queries(alice, url, {"runs": _ids(small), **query})
    with django_assert_num_queries(expected):
        response = alice.get(url, {"runs": _ids(large), **query})
    assert response.status_code == 200


def test_runs_list_does_not_grow_with_runs(alice, run_sets, django_assert_num_queries):
    small, large = run_sets
    # the small set's runs only (tag filter off, status filter on one run) vs all ten runs
    few = _queries(alice, "/runs/", {"status": "running"})
    with django_assert_num_queries(few):
        response = alice.get("/runs/")
    assert response.content.count(b"data-run-id=") == len(small) + len(large)
    with django_assert_num_queries(few + 1):  # the tag filter reads the experiments' tags
        alice.get("/runs/", {"tag": "r3", "sort": "owner"})


def test_experiment_page_and_chart_do_not_grow_with_runs(
    alice, make_run, user, django_assert_num_queries
):
    from lab.experiments.services import create_experiment

    counts = []
    for n in (2, 7):
        exp = create_experiment(owner=user, name=f"exp {n}", preset="moe-grpo")
        for i in range(n):
            make_run(variant=f"v{i % 3}", seed=i, records=_metrics(i), experiment_=exp)
        counts.append(
            (
                _queries(alice, f"/experiments/{exp.pk}/", {}),
                _queries(alice, f"/experiments/{exp.pk}/chart", {"key": "reward/accuracy"}),
            )
        )
    assert counts[0] == counts[1]


def test_one_metrics_query_per_run_set(alice, run_sets):
    """The compare chart reads every run's series in one SELECT on the metric table."""
    _, large = run_sets
    with CaptureQueriesContext(connection) as ctx:
        alice.get("/compare/chart", {"runs": _ids(large), "key": "mismatch/kl_k3"})
    metric_reads = [q["sql"] for q in ctx.captured_queries if "runs_metricstep" in q["sql"]]
    assert len(metric_reads) == 1


def test_compare_chart_group_reads_all_its_metrics_in_one_query(alice, run_sets):
    """Ten charts of the compare page: one SELECT on the metric table, not ten."""
    _, large = run_sets
    keys = "reward/accuracy,mismatch/kl_k3,mismatch/kl_k1,eval/accuracy"
    with CaptureQueriesContext(connection) as ctx:
        response = alice.get("/compare/charts", {"runs": _ids(large), "keys": keys})
    assert response.status_code == 200
    assert list(response.json()["charts"]) == keys.split(",")
    metric_reads = [q["sql"] for q in ctx.captured_queries if "runs_metricstep" in q["sql"]]
    assert len(metric_reads) == 1
