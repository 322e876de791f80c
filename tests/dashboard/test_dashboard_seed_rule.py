"""A cancelled or failed run is not a seed of its variant unless the review's
switch includes it; then it is censored at its last step."""

from __future__ import annotations

import csv
import io

import pytest

from lab.runs.models import RunStatus
from tests.dashboard.conftest import payload_traces, records


def _run(make_run, seed, *, steps, collapse=None, status=RunStatus.SUCCEEDED):
    summary = {"collapsed": collapse is not None, "final_accuracy": 0.5, "steps": steps}
    if collapse is not None:
        summary |= {"collapse_step": collapse, "collapse_reason": "accuracy fell"}
    return make_run(
        variant="dense-grpo",
        seed=seed,
        records=records(steps, mismatch__kl_k3=lambda s: 1e-3),
        summary=summary,
        status=status,
    )


@pytest.fixture
def variant_with_a_cancelled_seed(make_run):
    runs = [
        _run(make_run, 0, steps=100, collapse=80),
        _run(make_run, 1, steps=100, collapse=90),
        _run(make_run, 2, steps=32, status=RunStatus.CANCELLED),  # cancelled at step 31
    ]
    return ",".join(str(r.pk) for r in runs), runs


def test_a_cancelled_run_moves_neither_the_seed_count_nor_the_bound(
    alice, variant_with_a_cancelled_seed
):
    ids, runs = variant_with_a_cancelled_seed
    row = alice.get("/stability/table", {"runs": ids}).json()["rows"][0]
    assert row["runs"] == 2
    assert row["collapse_step"] == "85" and row["collapse_step_is_lower_bound"] is False
    html = alice.get("/stability/", {"runs": ids}).content.decode()
    assert "Cancelled and failed runs are not seeds of their variant" in html
    assert f"#{runs[2].pk} (cancelled)" in html and "not a seed (cancelled)" in html
    survival = payload_traces(alice.get("/stability/chart/survival", {"runs": ids}))
    curve = next(t for t in survival if t["meta"]["role"] == "survival")
    assert curve["x"].tolist() == [0, 80, 90]


def test_the_switch_includes_stopped_runs_censored_at_their_last_step(
    alice, variant_with_a_cancelled_seed
):
    ids, _ = variant_with_a_cancelled_seed
    html = alice.get("/stability/", {"runs": ids}).content.decode()
    assert f"/stability/?runs={ids.replace(',', '%2C')}&amp;stopped=1" in html
    with_stopped = alice.get("/stability/", {"runs": ids, "stopped": "1"})
    page = with_stopped.content.decode()
    assert "included as seeds, censored at the steps they ran" in page
    # The page's downloads carry the switch, so they export what the page shows.
    assert "format=csv&amp;stopped=1" in page or "stopped=1&amp;format=csv" in page
    table = alice.get(
        "/stability/table", {"runs": ids, "stopped": "1", "format": "csv"}
    ).content.decode()
    row = next(csv.DictReader(io.StringIO(table)))
    assert row["runs"] == "3" and row["collapse_step"] == ">= 67"  # (80 + 90 + 32) / 3
    survival = payload_traces(alice.get("/stability/chart/survival", {"runs": ids, "stopped": "1"}))
    censored = next(t for t in survival if t["meta"]["role"] == "censored")
    assert censored["x"].tolist() == [32]  # 32 steps run: its last step, 31, + 1


def test_a_bad_switch_value_is_a_400_naming_it(alice, variant_with_a_cancelled_seed):
    ids, _ = variant_with_a_cancelled_seed
    response = alice.get("/stability/table", {"runs": ids, "stopped": "maybe"})
    assert response.status_code == 400 and "stopped" in response.content.decode()


@pytest.mark.parametrize(
    ("first", "last", "ran"),
    [(0, 99, 100), (1, 4, 4), (10, 200, 200), (0, 0, 1)],
)
def test_steps_run_counts_from_the_first_stored_step(first, last, ran):
    from dashboard.review.queries import steps_run

    # the lab stores steps 0 .. N - 1; TRL logs global_step 1 .. N; a tracker that
    # logs every 10th step from 10 ran its last logged step
    assert steps_run(first, last) == ran


def test_a_run_whose_steps_count_from_one_is_censored_at_its_last_step(alice, make_run):
    run = make_run(
        variant="trl",
        seed=0,
        records=[{"step": s, "mismatch/kl_k3": 1e-3} for s in range(1, 5)],  # steps 1-4
        summary={"collapsed": False},
    )
    row = alice.get("/stability/table", {"runs": str(run.pk)}).json()["rows"][0]
    assert row["collapse_step"] == ">= 4" and row["collapse_step_is_lower_bound"] is True
