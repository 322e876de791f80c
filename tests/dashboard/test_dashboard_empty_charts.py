"""What an empty run chart says: never "no data yet" for a metric the run will never log."""

from __future__ import annotations

from lab.runs.models import RunStatus
from tests.dashboard.conftest import records


def _message(alice, run, key: str) -> str:
    body = alice.get(f"/runs/{run.pk}/chart", {"key": key}).json()
    return body["figure"]["layout"]["meta"]["placeholder"]


def test_a_finished_run_says_not_logged_for_a_metric_it_never_logged(alice, make_run):
    run = make_run(records=records(5, reward__accuracy=lambda s: 0.5))
    assert _message(alice, run, "tis/clip_frac").endswith("not logged by this run")


def test_a_dense_run_never_logs_moe_metrics_even_while_training(alice, make_run):
    run = make_run(
        records=records(5, reward__accuracy=lambda s: 0.5),
        status=RunStatus.RUNNING,
        overrides={"model.n_experts": 0},
    )
    message = _message(alice, run, "mismatch/routing_inconsistency")
    assert message == "routing inconsistency: not logged by this run"


def test_a_training_run_waits_for_its_first_step_then_for_the_metric(alice, make_run):
    queued = make_run(status=RunStatus.RUNNING)
    assert _message(alice, queued, "reward/accuracy").endswith("waiting for the first step")
    training = make_run(records=records(3, reward__mean=lambda s: 1.0), status=RunStatus.RUNNING)
    assert _message(alice, training, "eval/accuracy").endswith("no data yet")
