"""The MLflow tracking API in-process (Django's test client): shapes, rights, MLflow's
limits and error JSON, idempotent batches, the metric mapping on ingest, expert-load
vectors, status mapping and collapse detection when a run ends."""

from __future__ import annotations

import base64

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow_rest import Mlflow

from lab.runs.metrics.read import metric_series_many
from lab.runs.models import MetricStep, Run
from lab.tracking.models import TrackedRun

# What the database itself decides (docs/design.md 4): also run on PostgreSQL.
pytestmark = pytest.mark.database


@pytest.fixture
def ml(user):
    return Mlflow(user)


@pytest.fixture
def exp_id(ml):
    return ml.ok("POST", "experiments/create", {"name": "ext"})["experiment_id"]


def _metric(key, value, step, ts=1000):
    return {"key": key, "value": value, "timestamp": ts, "step": step}


def _series(run_id, keys):
    return metric_series_many([int(run_id)], keys)[int(run_id)]


@pytest.mark.slow
def test_experiment_and_run_round_trip(ml, exp_id, user):
    assert ml.ok("GET", "experiments/get", {"experiment_id": exp_id})["experiment"]["name"] == "ext"
    by_name = ml.ok("GET", "experiments/get-by-name", {"experiment_name": "ext"})
    assert by_name["experiment"]["experiment_id"] == exp_id
    searched = ml.ok("POST", "experiments/search", {"filter": "name = 'ext'", "max_results": 10})
    assert [e["name"] for e in searched["experiments"]] == ["ext"]

    run_id = ml.run(exp_id, "seed-0", {"mlflow.source.name": "train.py"})
    ml.ok("POST", "runs/log-batch", {
        "run_id": run_id,
        "metrics": [_metric("loss", 1.5, 0), _metric("loss", 1.2, 1)],
        "params": [{"key": "lr", "value": "1e-6"}],
        "tags": [{"key": "team", "value": "rl"}],
    })  # fmt: skip
    ml.ok(
        "POST",
        "runs/log-metric",
        {"run_id": run_id, "key": "acc", "value": 0.5, "timestamp": 5, "step": 1},
    )
    ml.ok("POST", "runs/log-parameter", {"run_id": run_id, "key": "seed", "value": "0"})
    ml.ok("POST", "runs/set-tag", {"run_id": run_id, "key": "gone", "value": "x"})
    ml.ok("POST", "runs/delete-tag", {"run_id": run_id, "key": "gone"})
    got = ml.ok("GET", "runs/get", {"run_id": run_id})["run"]
    assert got["info"]["status"] == "RUNNING" and got["info"]["run_name"] == "seed-0"
    assert {m["key"]: m["value"] for m in got["data"]["metrics"]} == {"loss": 1.2, "acc": 0.5}
    assert {p["key"]: p["value"] for p in got["data"]["params"]} == {"lr": "1e-6", "seed": "0"}
    tags = {t["key"]: t["value"] for t in got["data"]["tags"]}
    assert tags["team"] == "rl" and "gone" not in tags

    run = Run.objects.get(pk=int(run_id))
    assert run.is_external and run.owner == user and run.current_step == 2
    assert run.source["source_name"] == "train.py"
    assert run.config["params"] == {"lr": "1e-6", "seed": "0"}

    updated = ml.ok("POST", "runs/update", {"run_id": run_id, "status": "KILLED", "end_time": 9})
    assert updated["run_info"]["status"] == "KILLED" and updated["run_info"]["end_time"] == 9
    assert Run.objects.get(pk=int(run_id)).status == "cancelled"
    found = ml.ok(
        "POST",
        "runs/search",
        {"experiment_ids": [exp_id], "filter": "attributes.status = 'KILLED'"},
    )
    assert [r["info"]["run_id"] for r in found["runs"]] == [run_id]
    assert (
        ml.ok("POST", "runs/search", {"experiment_ids": [exp_id], "filter": "tags.team = 'ml'"})[
            "runs"
        ]
        == []
    )
    ml.ok("POST", "runs/delete", {"run_id": run_id})
    assert not Run.objects.filter(pk=int(run_id)).exists()


def test_a_retried_batch_stores_nothing_twice(ml, exp_id):
    run_id = ml.run(exp_id)
    batch = {
        "run_id": run_id,
        "metrics": [_metric(f"k{i}", float(i), s) for s in range(5) for i in range(3)],
    }
    ml.ok("POST", "runs/log-batch", batch)
    before = list(MetricStep.objects.filter(run_id=int(run_id)).values_list("step", "values"))
    ml.ok("POST", "runs/log-batch", batch)
    after = list(MetricStep.objects.filter(run_id=int(run_id)).values_list("step", "values"))
    assert before == after and len(after) == 5
    # a later batch at the same steps adds its keys to the step's row
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": [_metric("extra", 7.0, 2)]})
    row = MetricStep.objects.get(run_id=int(run_id), step=2).values
    assert row == {"k0": 0.0, "k1": 1.0, "k2": 2.0, "extra": 7.0}
    # within one batch, the later timestamp of a (key, step) wins
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": [
        _metric("k0", 5.0, 3, ts=20), _metric("k0", 4.0, 3, ts=10)]})  # fmt: skip
    assert MetricStep.objects.get(run_id=int(run_id), step=3).values["k0"] == 5.0


def test_the_latest_value_is_mlflows_over_batches_and_out_of_order_points(ml, exp_id):
    """runs/get's metrics: per name the point with the largest (step, timestamp, value),
    a later point winning a tie, whatever order the points came in (worked by hand)."""
    run_id = ml.run(exp_id)
    ml.ok(
        "POST",
        "runs/log-batch",
        {
            "run_id": run_id,
            "metrics": [
                _metric("loss", 1.0, 3, ts=10),
                _metric("loss", 2.0, 5, ts=5),  # step 5 beats step 3
                _metric("loss", 1.5, 5, ts=5),  # same step and time, smaller value: not later
                _metric("loss", 9.0, 4, ts=99),  # an earlier step, however late its clock
                _metric("acc", 0.1, 1, ts=7),
                _metric("acc", 0.3, 1, ts=8),  # same step, later clock
            ],
        },
    )
    ml.ok(
        "POST",
        "runs/log-batch",
        {
            "run_id": run_id,
            "metrics": [
                _metric("acc", 0.9, 0, ts=50),  # an earlier step than the stored one: kept as is
                _metric("loss", 2.5, 5, ts=5),  # same step and time, larger value: later
            ],
        },
    )
    got = ml.ok("GET", "runs/get", {"run_id": run_id})["run"]["data"]["metrics"]
    assert sorted((m["key"], m["value"], m["timestamp"], m["step"]) for m in got) == [
        ("acc", 0.3, 8, 1),
        ("loss", 2.5, 5, 5),
    ]


def test_non_finite_values_are_gaps(ml, exp_id):
    run_id = ml.run(exp_id)
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": [
        _metric("loss", "NaN", 0), _metric("loss", "Infinity", 1), _metric("loss", 2.0, 2)]})  # fmt: skip
    assert MetricStep.objects.get(run_id=int(run_id), step=0).values == {"loss": None}
    got = ml.ok("GET", "runs/get", {"run_id": run_id})["run"]["data"]["metrics"]
    assert got == [{"key": "loss", "value": 2.0, "timestamp": 1000, "step": 2}]


def test_framework_names_are_stored_under_lab_keys(ml, exp_id):
    run_id = ml.run(exp_id)  # no lab.framework tag: detected from verl's own names
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": [
        _metric("rollout_corr/kl", 0.01, 0), _metric("actor/pg_clipfrac", 0.2, 0),
        _metric("critic/score/mean", 0.5, 0), _metric("perf/throughput", 99.0, 0)]})  # fmt: skip
    assert Run.objects.get(pk=int(run_id)).source["framework"] == "verl"
    assert MetricStep.objects.get(run_id=int(run_id), step=0).values == {
        "mismatch/kl_k1": 0.01, "policy/clip_frac": 0.2, "reward/mean": 0.5, "perf/throughput": 99.0,
    }  # fmt: skip
    tracked = TrackedRun.objects.get(run_id=int(run_id))
    assert tracked.stored_as["rollout_corr/kl"] == "mismatch/kl_k1"
    names = {
        m["key"] for m in ml.ok("GET", "runs/get", {"run_id": run_id})["run"]["data"]["metrics"]
    }
    assert names == {"rollout_corr/kl", "actor/pg_clipfrac", "critic/score/mean", "perf/throughput"}


def test_expert_load_scalars_become_the_lab_vector(ml, exp_id):
    run_id = ml.run(exp_id)
    first = [_metric(f"experts/load/L1/e{e}", 0.25, 0) for e in range(2)]
    second = [_metric(f"experts/load/L1/e{e}", 0.25, 0) for e in range(2, 4)]
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": first})
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": second})
    assert MetricStep.objects.get(run_id=int(run_id), step=0).values == {
        "experts/load/L1": [0.25, 0.25, 0.25, 0.25]
    }
    assert Run.objects.get(pk=int(run_id)).config["model"] == {
        "n_experts": 4, "n_layers": 2, "dense_layers": [0]
    }  # fmt: skip
    steps, values = _series(run_id, ["experts/load/L1"]).series["experts/load/L1"]
    assert list(steps) == [0] and list(values[0]) == [0.25] * 4


def test_a_batch_of_points_leaves_the_logged_params_unwritten(ml, exp_id):
    """A run's config holds its params (hundreds for a transformers run): a batch with
    only points does not rewrite it, and the params stay."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run_id = ml.run(exp_id)
    params = [{"key": f"p{i}", "value": str(i)} for i in range(100)]
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "params": params})
    with CaptureQueriesContext(connection) as queries:
        ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": [_metric("loss", 1.0, 3)]})
    run_updates = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "runs_run"')]
    assert run_updates and not any('"config"' in sql for sql in run_updates)
    run = Run.objects.get(pk=int(run_id))
    assert run.config["params"] == {f"p{i}": str(i) for i in range(100)}
    assert (run.current_step, run.total_steps) == (1, 1)


def test_the_layers_that_log_no_expert_load_are_the_dense_ones(ml, exp_id, user):
    """A Qwen3-MoE with a dense layer 1 (``mlp_only_layers``) logs the load of layers 0
    and 2: layer 1 is dense, so the layer pickers offer 0 and 2 only; a layer whose
    load comes in a later batch stops being dense, and a retried batch changes nothing."""
    from dashboard.charts.panels import moe_layers

    run_id = ml.run(exp_id)
    layer2 = [_metric(f"experts/load/L2/e{e}", 0.5, 1) for e in range(2)]
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": layer2})
    assert Run.objects.get(pk=int(run_id)).config["model"]["dense_layers"] == [0, 1]
    layer0 = [_metric(f"experts/load/L0/e{e}", 0.5, 1) for e in range(2)]
    for _ in range(2):
        ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": layer0})
    config = Run.objects.get(pk=int(run_id)).config
    assert config["model"] == {"n_experts": 2, "n_layers": 3, "dense_layers": [1]}
    assert moe_layers(config) == [0, 2]
    browser = Client()
    browser.force_login(user)
    html = browser.get(f"/runs/{run_id}/").content.decode()
    picker = html.split("data-layer-picker")[1].split("</select>")[0]
    assert 'value="0"' in picker and 'value="2"' in picker and 'value="1"' not in picker


def test_mlflow_metric_names_with_spaces_and_colons_are_read_and_charted(ml, exp_id, user, api):
    """TRL times its phases through MLflow as ``profiling/Time taken: GRPOTrainer.<phase>``
    (trl/extras/profiling.py): MLflow's name alphabet has spaces and colons, so the
    metrics API and the chart endpoints read such a name (dots too) as it was logged,
    each timing charted at the step it timed (logged at the step before)."""
    name = "profiling/Time taken: GRPOTrainer.transformers.generate"
    run_id = ml.run(exp_id, tags={"lab.framework": "trl"})
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": [
        _metric(name, 0.5 + s, s) for s in range(3)]})  # fmt: skip
    body = api.get(f"/api/runs/{run_id}/metrics", {"keys": f"{name},reward/mean"}).json()
    assert body["steps"] == [1, 2, 3] and body["series"][name] == [0.5, 1.5, 2.5]
    assert name in api.get(f"/api/runs/{run_id}/metrics").json()["available_keys"]
    browser = Client()
    browser.force_login(user)
    chart = browser.get(f"/runs/{run_id}/chart", {"key": name, "format": "csv"})
    assert chart.status_code == 200 and "2.5" in chart.content.decode()
    compared = browser.get("/compare/charts", {"runs": run_id, "keys": name})
    assert compared.status_code == 200 and name in compared.json()["charts"]
    for bad in ('a"b', "a,b!", "x" * 201):
        refused = api.get(f"/api/runs/{run_id}/metrics", {"keys": bad})
        assert refused.status_code == 400, bad


def test_a_collapsing_run_is_detected_when_it_ends(ml, exp_id):
    run_id = ml.run(exp_id, tags={"lab.framework": "trl"})
    accuracy = [0.6] * 40 + [0.02] * 30
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": [
        _metric("rewards/accuracy_reward/mean", a, s) for s, a in enumerate(accuracy)]})  # fmt: skip
    ml.ok("POST", "runs/update", {"run_id": run_id, "status": "FINISHED"})
    run = Run.objects.get(pk=int(run_id))
    assert run.status == "succeeded" and run.summary["collapsed"] is True
    assert 36 <= run.summary["collapse_step"] <= 42
    assert run.summary["collapse_metric"] == "reward/accuracy"
    assert run.metric_chunks_sealed == 1  # final: its metrics are columns now


@pytest.mark.slow
def test_limits_and_errors(ml, exp_id, other_user):
    run_id = ml.run(exp_id)
    cases = [
        (
            "runs/log-batch",
            {"run_id": run_id, "metrics": [_metric("k", 1.0, s) for s in range(1001)]},
        ),
        (
            "runs/log-batch",
            {"run_id": run_id, "params": [{"key": f"p{i}", "value": "v"} for i in range(101)]},
        ),
        (
            "runs/log-batch",
            {"run_id": run_id, "tags": [{"key": f"t{i}", "value": "v"} for i in range(101)]},
        ),
        ("runs/log-batch", {"run_id": run_id, "metrics": [_metric("k" * 201, 1.0, 0)]}),
        ("runs/log-batch", {"run_id": run_id, "params": [{"key": "p", "value": "v" * 6001}]}),
        ("runs/log-batch", {"run_id": run_id, "metrics": [_metric("k", "abc", 0)]}),
        ("runs/log-batch", {"run_id": run_id, "metrics": [_metric("k", 1.0, -1)]}),
        ("runs/log-batch", {"run_id": run_id, "metrics": [{"key": "k", "value": 1.0}]}),
        ("runs/log-batch", {"run_id": run_id, "metrics": [_metric("k\x00", 1.0, 0)]}),
        ("runs/log-batch", {"run_id": run_id, "metrics": "nope"}),
        ("runs/update", {"run_id": run_id, "status": "EXPLODED"}),
        ("runs/create", {"experiment_id": "abc"}),
        ("experiments/create", {"name": ""}),
        ("experiments/create", {"name": 5}),
    ]
    for route, body in cases:
        code, data = ml.call("POST", route, body)
        assert (code, data["error_code"]) == (400, "INVALID_PARAMETER_VALUE"), (route, data)
    assert (
        ml.call("POST", "runs/log-batch", "{not json")[1]["error_code"] == "INVALID_PARAMETER_VALUE"
    )
    assert ml.call("POST", "runs/log-batch", "[1]")[1]["error_code"] == "INVALID_PARAMETER_VALUE"

    ml.ok("POST", "runs/log-parameter", {"run_id": run_id, "key": "lr", "value": "1"})
    ml.ok("POST", "runs/log-parameter", {"run_id": run_id, "key": "lr", "value": "1"})  # same: fine
    code, data = ml.call(
        "POST", "runs/log-parameter", {"run_id": run_id, "key": "lr", "value": "2"}
    )
    assert (code, data["error_code"]) == (400, "INVALID_PARAMETER_VALUE")

    assert ml.call("GET", "runs/get", {"run_id": "424242"})[:1] == (404,)
    assert (
        ml.call("GET", "runs/get", {"run_id": "424242"})[1]["error_code"]
        == "RESOURCE_DOES_NOT_EXIST"
    )
    assert (
        ml.call("GET", "experiments/get-by-name", {"experiment_name": "nope"})[1]["error_code"]
        == "RESOURCE_DOES_NOT_EXIST"
    )
    assert ml.call("POST", "experiments/create", {"name": "ext"})[:1] == (400,)
    assert (
        ml.call("POST", "experiments/create", {"name": "ext"})[1]["error_code"]
        == "RESOURCE_ALREADY_EXISTS"
    )

    code, data = ml.call("GET", "runs/get", {"run_id": run_id}, auth=None)
    assert (code, data["error_code"]) == (401, "UNAUTHENTICATED")
    code, data = ml.call("GET", "runs/get", {"run_id": run_id}, auth="Bearer wrong")
    assert (code, data["error_code"]) == (401, "UNAUTHENTICATED")
    code, data = ml.call("GET", "runs/get", {"run_id": run_id}, auth="Basic !!!")
    assert (code, data["error_code"]) == (401, "UNAUTHENTICATED")
    good_basic = "Basic " + base64.b64encode(b"alice:pw-alice").decode()
    assert ml.call("GET", "runs/get", {"run_id": run_id}, auth=good_basic)[0] == 200

    # another user reads, but neither logs to the run nor adds runs to an unshared experiment
    bob = Mlflow(other_user)
    assert bob.call("GET", "runs/get", {"run_id": run_id})[0] == 200
    code, data = bob.call(
        "POST", "runs/log-batch", {"run_id": run_id, "metrics": [_metric("k", 1.0, 0)]}
    )
    assert (code, data["error_code"]) == (403, "PERMISSION_DENIED")
    code, data = bob.call("POST", "runs/create", {"experiment_id": exp_id})
    assert (code, data["error_code"]) == (403, "PERMISSION_DENIED")
    assert not MetricStep.objects.filter(run_id=int(run_id)).exists()


def test_lab_runs_are_not_served_and_the_default_experiment(ml, user, experiment):
    from lab_processes import submit_tiny_run

    lab_run = submit_tiny_run(user, experiment)
    assert (
        ml.call("GET", "runs/get", {"run_id": str(lab_run.pk)})[1]["error_code"]
        == "RESOURCE_DOES_NOT_EXIST"
    )
    default = ml.ok("GET", "experiments/get", {"experiment_id": "0"})["experiment"]
    assert default["name"] == "Default"
    assert ml.ok("GET", "experiments/get", {"experiment_id": "0"})["experiment"] == default
    run_id = ml.run("0")
    assert Run.objects.get(pk=int(run_id)).experiment_id == int(default["experiment_id"])


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["run_id", "metrics", "params", "tags", "key", "value", "step",
                         "timestamp", "experiment_id", "name", "status", "run_name"]) | st.text(max_size=5),
        inner, max_size=5),
    max_leaves=12,
))  # fmt: skip
@pytest.mark.slow
def test_arbitrary_bodies_never_get_a_500(db, user, body):
    ml = Mlflow(user)
    for route in ("runs/log-batch", "runs/create", "runs/update", "experiments/create",
                  "runs/log-metric", "runs/set-tag"):  # fmt: skip
        code, data = ml.call("POST", route, body)
        assert code < 500, (route, body, data)
        if code != 200:
            assert data["error_code"] and data["message"]


def test_the_run_page_says_where_an_external_run_came_from(ml, exp_id, user):
    run_id = ml.run(exp_id, "verl-seed0", {"lab.host": "gpu-node-7"})
    ml.ok(
        "POST",
        "runs/log-batch",
        {"run_id": run_id, "metrics": [_metric("rollout_corr/kl", 0.01, 0)]},
    )
    ml.ok("POST", "runs/update", {"run_id": run_id, "status": "FAILED"})
    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/runs/{run_id}/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "Trained elsewhere" in html and "framework verl" in html and "host gpu-node-7" in html
    for hidden in ("Cancel run", "Requeue", "Clone with changes", "Export as a Hugging Face"):
        assert hidden not in html, hidden
    assert "Delete run" in html  # the owner may still delete it


def test_the_queue_and_the_lab_actions_leave_an_external_run_alone(ml, exp_id, user):
    """An external run is RUNNING while its trainer logs, but holds no place in the
    lab's queues: the queue page does not list it, bulk cancel and requeue skip it
    (and say so), a cancel, requeue or export of it is refused, the reconciler
    never takes it for a lost worker's run."""
    from datetime import timedelta

    from django.utils import timezone

    from lab.jobs.services import reconcile_stale_runs
    from lab.runs import bulk, exports, lifecycle
    from trainer.errors import FieldError

    run = Run.objects.get(pk=int(ml.run(exp_id, "trl-seed0")))
    assert run.is_external and run.status == "running"
    browser = Client()
    browser.force_login(user)
    queue = browser.get("/queue/").content.decode()
    assert "trl-seed0" not in queue
    outcome = bulk.cancel_runs([run.pk], user=user)
    assert outcome.done == [] and outcome.external == [run.pk]
    assert "1 external run left alone" in outcome.message("Cancelled")
    with pytest.raises(lifecycle.InvalidState, match="trained elsewhere"):
        lifecycle.cancel_run(run, user=user)
    page = browser.post(f"/runs/{run.pk}/cancel", follow=True).content.decode()
    assert "trained elsewhere" in page
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(days=1))
    assert reconcile_stale_runs(60) == []
    ml.ok("POST", "runs/update", {"run_id": str(run.pk), "status": "FAILED"})
    run.refresh_from_db()
    assert run.status == "failed" and not run.cancel_requested
    assert bulk.requeue_runs([run.pk], user=user).external == [run.pk]
    with pytest.raises(lifecycle.InvalidState, match="trained elsewhere"):
        bulk.requeue_run(run, user=user)
    with pytest.raises(FieldError, match="not in the lab"):
        exports.request_export(run, user=user)
    run.refresh_from_db()
    assert run.status == "failed"


def test_metric_history_returns_each_step_as_logged(ml, exp_id):
    """GetMetricHistory: every point under the name as logged, each with its own step and
    timestamp (two at one step both; the lab's step row keeps the later), in MLflow's
    order (timestamp, step, value), paged; a retried batch adds nothing; a mapped name
    (verl's) and one expert's load share (a slot of the layer's vector) read back as
    logged; a never-logged name has no points; a missing key is MLflow's
    INVALID_PARAMETER_VALUE."""
    run_id = ml.run(exp_id, "hist")
    batch = {"run_id": run_id, "metrics": [
        _metric("loss", 1.5, 0, ts=10), _metric("loss", 1.2, 1, ts=20),
        _metric("loss", 1.1, 1, ts=30), _metric("loss", "NaN", 2, ts=40),
        _metric("rollout_corr/kl", 0.25, 0), _metric("experts/load/L0/e1", 0.4, 0),
    ]}  # fmt: skip
    ml.ok("POST", "runs/log-batch", batch)
    ml.ok("POST", "runs/log-batch", batch)  # a client retrying
    history = ml.ok("GET", "metrics/get-history", {"run_id": run_id, "metric_key": "loss"})
    points = [(m["step"], m["value"], m["timestamp"]) for m in history["metrics"]]
    assert points == [(0, 1.5, 10), (1, 1.2, 20), (1, 1.1, 30), (2, "NaN", 40)]
    assert "next_page_token" not in history
    assert _series(run_id, ["loss"]).series["loss"][1][1] == 1.1  # the step's row: the later
    first = ml.ok("GET", "metrics/get-history",
                  {"run_id": run_id, "metric_key": "loss", "max_results": 2})  # fmt: skip
    assert len(first["metrics"]) == 2 and first["next_page_token"] == "2"
    rest = ml.ok("GET", "metrics/get-history", {"run_id": run_id, "metric_key": "loss",
                                                 "page_token": first["next_page_token"]})  # fmt: skip
    assert [m["step"] for m in rest["metrics"]] == [1, 2]
    mapped = ml.ok(
        "GET", "metrics/get-history", {"run_id": run_id, "metric_key": "rollout_corr/kl"}
    )
    assert [(m["key"], m["value"]) for m in mapped["metrics"]] == [("rollout_corr/kl", 0.25)]
    share = ml.ok("GET", "metrics/get-history",
                  {"run_id": run_id, "metric_key": "experts/load/L0/e1"})  # fmt: skip
    assert [m["value"] for m in share["metrics"]] == [0.4]
    none = ml.ok("GET", "metrics/get-history", {"run_id": run_id, "metric_key": "never"})
    assert none["metrics"] == []
    code, data = ml.call("GET", "metrics/get-history", {"run_id": run_id})
    assert code == 400 and data["error_code"] == "INVALID_PARAMETER_VALUE"
    code, data = ml.call("GET", "metrics/get-history", {"run_id": "999999", "metric_key": "x"})
    assert code == 404 and data["error_code"] == "RESOURCE_DOES_NOT_EXIST"
