"""REST API: validation with field paths, permissions, anonymous refused, no 500s."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from lab.runs.metrics.ingest import ingest_metrics
from lab.runs.models import Experiment, Run

ENDPOINTS = [
    ("get", "/api/schema/config"),
    ("get", "/api/presets"),
    ("get", "/api/openapi"),
    ("get", "/api/experiments"),
    ("post", "/api/experiments"),
    ("get", "/api/runs"),
    ("post", "/api/runs"),
    ("get", "/api/runs/1"),
    ("get", "/api/runs/1/metrics"),
    ("post", "/api/runs/1/cancel"),
    ("get", "/api/queue"),
    ("get", "/api/workers"),
]


@pytest.mark.parametrize("method, url", ENDPOINTS)
def test_anonymous_is_refused_everywhere(db, method, url):
    response = getattr(APIClient(), method)(url, HTTP_ACCEPT="application/json")
    assert response.status_code in (401, 403)
    assert "detail" in json.loads(response.content)


def test_token_auth(user):
    token = Token.objects.create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert client.get("/api/presets").status_code == 200


def test_schema_and_presets(api):
    schema = api.get("/api/schema/config").json()
    assert set(schema["properties"]) >= {"model", "rollout", "algorithm", "stabilizers", "run"}
    presets = {p["name"]: p for p in api.get("/api/presets").json()}
    assert "moe-grpo" in presets and presets["moe-grpo"]["description"]
    openapi = api.get("/api/openapi", HTTP_ACCEPT="application/json")
    assert openapi.status_code == 200


def _reconciler_row(seen_s_ago: float = 0.0, beat_alive: bool | None = True) -> None:
    """The live-worker row the reconciler (the ``control`` queue's worker) keeps fresh."""
    from datetime import timedelta

    from django.utils import timezone

    from lab.jobs.models import Worker

    Worker.objects.update_or_create(
        hostname="control@host",
        defaults={
            "queues": ["control"], "pid": 1, "beat_pid": 2, "beat_alive": beat_alive,
            "last_seen": timezone.now() - timedelta(seconds=seen_s_ago),
        },
    )  # fmt: skip


def test_health_answers_anonymous_callers_with_only_a_status(db):
    _reconciler_row()
    response = APIClient().get("/api/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_health_reports_db_broker_reconciler_and_workers(api):
    _reconciler_row()
    body = api.get("/api/health").json()
    assert body["status"] == "ok"
    assert body["db"]["ok"] is True
    assert "transport" in body["broker"]
    assert body["reconciler"] == {"ok": True, "hostname": "control@host", "beat_pid": 2}
    assert isinstance(body["workers"], list)


def test_health_is_not_ok_while_the_reconciler_is_down(api, db):
    down = api.get("/api/health")  # no control-queue worker has ever been seen
    assert down.status_code == 503
    assert (
        down.json()["reconciler"]["ok"] is False and "control" in down.json()["reconciler"]["error"]
    )
    assert APIClient().get("/api/health").json() == {"status": "unavailable"}
    _reconciler_row(seen_s_ago=120)  # its last heartbeat is older than the live window
    assert api.get("/api/health").status_code == 503
    _reconciler_row()
    assert api.get("/api/health").status_code == 200
    _reconciler_row(beat_alive=False)  # the worker lives, its scheduler was killed
    dead = api.get("/api/health")
    assert dead.status_code == 503 and "celery beat, pid 2" in dead.json()["reconciler"]["error"]
    _reconciler_row(beat_alive=None)  # a control worker started without -B schedules nothing
    assert "runs no scheduler" in api.get("/api/health").json()["reconciler"]["error"]


def _post(client, url, payload):
    return client.post(url, json.dumps(payload), content_type="application/json")


def test_create_experiment_and_run(api, tiny):
    exp = _post(api, "/api/experiments", {"name": "r3 study", "preset": "moe-grpo", "tags": ["r3"]})
    assert exp.status_code == 201, exp.json()
    run = _post(
        api,
        "/api/runs",
        {
            "experiment": exp.json()["id"],
            "preset": "moe-grpo-r3",
            "overrides": tiny,
            "queue": "cpu",
        },
    )
    assert run.status_code == 201, run.json()
    body = run.json()
    assert body["status"] == "queued" and body["queue_position"] == 1
    assert body["config"]["stabilizers"]["replay"]["mode"] == "r3"
    got = api.get(f"/api/runs/{body['id']}").json()
    assert got["owner"] == "alice" and got["total_steps"] == 3


@pytest.mark.parametrize(
    "payload, path",
    [
        ({"config": {"run": {"steps": "many"}}}, "config.run.steps"),
        ({"config": {"model": {"n_experts": 8, "top_k": 99}}}, "config.model.top_k"),
        ({"config": {"rollout": {"temperature": -1}}}, "config.rollout.temperature"),
        ({"config": {"surprise": {}}}, "config.surprise"),
        ({"preset": "moe-grpo", "overrides": {"run.steps": 0}}, "config.run.steps"),
        ({"preset": "moe-grpo", "overrides": 7}, "overrides"),
        ({"preset": "nope"}, "preset"),
        ({"preset": "moe-grpo", "queue": "tpu-v9"}, "queue"),
        ({"preset": "moe-grpo", "priority": 99}, "priority"),
        ({"preset": "moe-grpo", "colour": "red"}, "colour"),
        ({"config": [1, 2]}, "config"),
        ({"config": {}, "preset": "moe-grpo"}, "preset"),
    ],
)
def test_bad_run_input_is_400_with_field_path_and_stores_nothing(api, experiment, payload, path):
    response = _post(api, "/api/runs", {"experiment": experiment.pk, **payload})
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert any(k == path or k.startswith(path + ".") for k in errors), errors
    assert Run.objects.count() == 0


def test_unknown_experiment_and_malformed_json(api):
    assert _post(api, "/api/runs", {"experiment": 999, "preset": "moe-grpo"}).status_code == 400
    response = api.post("/api/runs", "{not json", content_type="application/json")
    assert response.status_code == 400 and "detail" in response.json()


def test_huge_payload_is_refused_with_413(api, experiment):
    blob = {"experiment": experiment.pk, "config": {"run": {"x": "a" * 400_000}}}
    response = _post(api, "/api/runs", blob)
    assert response.status_code == 413
    assert "payload too large" in response.json()["errors"]["__all__"][0]
    assert Run.objects.count() == 0


def test_bad_experiment_input(api):
    response = _post(api, "/api/experiments", {"name": "", "base_config": {"run": {"seed": -1}}})
    assert response.status_code == 400
    assert "name" in response.json()["errors"]
    response = _post(api, "/api/experiments", {"name": "x", "base_config": {"run": {"seed": -1}}})
    assert "config.run.seed" in response.json()["errors"]
    assert Experiment.objects.count() == 0


def _create_run(api, experiment, tiny):
    return _post(
        api, "/api/runs", {"experiment": experiment.pk, "preset": "moe-grpo", "overrides": tiny}
    ).json()


def test_cancel_permissions(api, other_api, experiment, tiny):
    run = _create_run(api, experiment, tiny)
    denied = other_api.post(f"/api/runs/{run['id']}/cancel")
    assert denied.status_code == 403
    assert Run.objects.get(pk=run["id"]).status == "queued"
    assert other_api.get(f"/api/runs/{run['id']}").status_code == 200  # the team may view
    assert other_api.delete(f"/api/runs/{run['id']}").status_code == 403
    ok = api.post(f"/api/runs/{run['id']}/cancel")
    assert ok.status_code == 200 and ok.json()["status"] == "cancelled"
    assert api.delete(f"/api/runs/{run['id']}").status_code == 204


def test_metrics_endpoint(api, experiment, tiny):
    run = _create_run(api, experiment, tiny)
    ingest_metrics(run["id"], [{"step": s, "reward/accuracy": s / 4} for s in range(4)])
    url = f"/api/runs/{run['id']}/metrics"
    assert api.get(url).json()["available_keys"] == ["reward/accuracy"]
    body = api.get(url, {"keys": "reward/accuracy", "start": 1, "end": 2}).json()
    assert body["steps"] == [1, 2] and body["series"]["reward/accuracy"] == [0.25, 0.5]
    bad = api.get(url, {"keys": "reward/accuracy", "max_points": "-3", "start": "x"})
    assert bad.status_code == 400 and set(bad.json()["errors"]) == {"max_points", "start"}
    assert bad.json()["errors"]["start"] == ["an integer from 0 to 1000000000"]
    not_a_key = api.get(url, {"keys": "reward/accuracy,bad key!"}).json()["errors"]
    assert not_a_key == {"keys": ["not a metric key: 'bad key!'"]}
    repeated = api.get(f"{url}?keys=reward/accuracy&keys=reward/mean").json()
    assert set(repeated["series"]) == {"reward/accuracy", "reward/mean"}
    assert api.get("/api/runs/424242/metrics").status_code == 404


def test_metrics_endpoint_thinning_keeps_a_one_step_kl_spike(api, experiment, tiny):
    run = _create_run(api, experiment, tiny)
    spike_step = 3217
    ingest_metrics(
        run["id"],
        [
            {
                "step": s,
                "mismatch/kl_k3": 0.75 if s == spike_step else 1e-3,
                "reward/mean": s / 5000,
            }
            for s in range(5000)
        ],
    )
    body = api.get(
        f"/api/runs/{run['id']}/metrics", {"keys": "mismatch/kl_k3,reward/mean", "max_points": 50}
    ).json()
    assert len(body["steps"]) <= 50 and body["steps"][-1] == 4999
    kl = dict(zip(body["steps"], body["series"]["mismatch/kl_k3"], strict=True))
    assert kl[spike_step] == 0.75  # every n-th step would have dropped it
    assert (
        api.get(
            f"/api/runs/{run['id']}/metrics", {"keys": "reward/mean", "max_points": 3}
        ).status_code
        == 400
    )


def test_sweep_preview_and_create(api, experiment):
    payload = {
        "experiment": experiment.pk,
        "grid": {"stabilizers.replay.mode": ["none", "r3"]},
        "seeds": [0, 1, 2],
        "preview": True,
    }
    assert _post(api, "/api/sweeps", payload).json()["count"] == 6
    assert Run.objects.count() == 0
    payload["preview"] = False
    created = _post(api, "/api/sweeps", payload)
    assert created.status_code == 201 and len(created.json()["runs"]) == 6
    payload["grid"] = {"stabilizers.replay.mode": ["r9"]}
    bad = _post(api, "/api/sweeps", payload)
    assert bad.status_code == 400 and "grid.stabilizers.replay.mode" in bad.json()["errors"]


def test_comments_and_clone(api, other_api, experiment, tiny):
    run = _create_run(api, experiment, tiny)
    posted = _post(other_api, f"/api/runs/{run['id']}/comments", {"body": "<script>x</script>"})
    assert posted.status_code == 201 and posted.json()["author"] == "bob"
    assert api.get(f"/api/runs/{run['id']}/comments").json()["count"] == 1
    # a clone is queued into the source's experiment: bob is an outsider there
    clone = _post(other_api, f"/api/runs/{run['id']}/clone", {"overrides": {"run.seed": 7}})
    assert clone.status_code == 403
    clone = _post(api, f"/api/runs/{run['id']}/clone", {"overrides": {"run.seed": 7}})
    assert clone.status_code == 201 and clone.json()["seed"] == 7


def test_session_auth_needs_csrf(user, experiment):
    client = Client(enforce_csrf_checks=True)
    client.login(username="alice", password="pw-alice")
    response = client.post(
        "/api/runs",
        json.dumps({"experiment": experiment.pk, "preset": "moe-grpo"}),
        content_type="application/json",
    )
    assert response.status_code == 403
