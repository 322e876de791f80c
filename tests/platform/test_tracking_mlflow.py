"""The real ``mlflow`` client against a live lab server (gunicorn, LabStack): a run
logged with the client's fluent API appears in the lab (API and run page) with
its parameters, charts and status; a failed run; the verl path (a metric
stream under verl's own names replayed through the client); auth by token and
by login; MLflow-style errors from the client's own exceptions."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

mlflow = pytest.importorskip("mlflow")

from lab_processes import LabStack  # noqa: E402
from mlflow.exceptions import MlflowException, RestException  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = LabStack(tmp_path_factory.mktemp("tracking"), "filesystem")
    yield s
    s.close()


@pytest.fixture
def client_env(stack, monkeypatch):
    """The environment a training job sets (docs/integrations.md)."""
    uri = f"http://127.0.0.1:{stack.port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", stack.token)
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    mlflow.set_tracking_uri(uri)
    yield uri
    while mlflow.active_run() is not None:
        mlflow.end_run()


def _raw(stack, method, path, body=None, auth=None):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = auth
    req = urllib.request.Request(
        f"http://127.0.0.1:{stack.port}{path}", data=data, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_a_run_logged_with_the_mlflow_client_is_a_lab_run(stack, client_env):
    experiment = mlflow.set_experiment("TRL GRPO on Qwen3-MoE")
    with mlflow.start_run(run_name="grpo-seed0") as active:
        mlflow.log_params({"learning_rate": "1e-6", "num_generations": "8"})
        mlflow.set_tags({"lab.framework": "trl", "team": "rl"})
        for step in range(5):
            mlflow.log_metrics(
                {"reward": 0.1 * step, "kl": 0.01 * step, "entropy": 1.0 - 0.1 * step,
                 "my/custom_metric": float(step)},
                step=step,
            )  # fmt: skip
        run_id = active.info.run_id

    # MLflow's own view through the client
    fetched = mlflow.get_run(run_id)
    assert fetched.info.status == "FINISHED"
    assert fetched.data.params == {"learning_rate": "1e-6", "num_generations": "8"}
    assert fetched.data.tags["team"] == "rl"
    assert fetched.data.metrics["reward"] == pytest.approx(0.4)
    assert fetched.info.experiment_id == experiment.experiment_id
    found = mlflow.search_runs([experiment.experiment_id], output_format="list")
    assert [r.info.run_id for r in found] == [run_id]
    history = mlflow.MlflowClient().get_metric_history(run_id, "kl")
    assert [m.step for m in history] == [0, 1, 2, 3, 4]
    assert [m.value for m in history] == pytest.approx([0.01 * s for s in range(5)])

    # The lab's view: a finished external run in the experiment, mapped keys under the
    # lab's names, an unmapped one as it is
    run = stack.run(int(run_id))
    assert run["status"] == "succeeded"
    assert run["experiment"] == int(experiment.experiment_id)
    metrics = stack.get(
        f"/api/runs/{run_id}/metrics?keys=reward/mean,policy/kl_ref,my/custom_metric"
    )
    assert metrics["steps"] == [0, 1, 2, 3, 4]
    assert metrics["series"]["reward/mean"] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert metrics["series"]["policy/kl_ref"][4] == pytest.approx(0.04)
    assert metrics["series"]["my/custom_metric"] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_failed_run_and_the_run_page(stack, client_env):
    mlflow.set_experiment("failures")
    with pytest.raises(RuntimeError), mlflow.start_run(run_name="crashes") as active:
        mlflow.log_metric("reward", 0.5, step=0)
        raise RuntimeError("out of memory")
    run_id = active.info.run_id
    assert mlflow.get_run(run_id).info.status == "FAILED"
    assert stack.run(int(run_id))["status"] == "failed"
    # the run page renders for an external run (logged in through the browser session)
    session = _session(stack)
    with session.open(f"http://127.0.0.1:{stack.port}/runs/{run_id}/", timeout=30) as resp:
        html = resp.read().decode()
    assert resp.status == 200
    assert "crashes" in html


def _session(stack):
    import http.cookiejar
    import re

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    base = f"http://127.0.0.1:{stack.port}"
    page = opener.open(f"{base}/accounts/login/", timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    data = f"username=e2e&password=pw&csrfmiddlewaretoken={token}".encode()
    req = urllib.request.Request(
        f"{base}/accounts/login/", data=data, headers={"Referer": f"{base}/accounts/login/"}
    )
    opener.open(req, timeout=30).read()
    return opener


def test_verl_metric_stream_replayed_through_the_client(stack, client_env):
    """verl's tracker (verl/utils/tracking.py, backend "mlflow"): set_experiment(project),
    start_run(run_name=experiment), log_params(flattened config), then
    log_metrics(data, step) per step under verl's names."""
    experiment = mlflow.set_experiment("verl_grpo_moe")
    run = mlflow.start_run(experiment_id=experiment.experiment_id, run_name="qwen3_moe_fp8")
    mlflow.log_params({"actor_rollout_ref.actor.optim.lr": "1e-06", "data.train_batch_size": "512"})
    for step in range(1, 4):
        mlflow.log_metrics(
            {
                "rollout_corr/kl": 0.001 * step,
                "rollout_corr/k3_kl": 0.0005 * step,
                "actor/pg_clipfrac": 0.02,
                "actor/entropy": 0.9,
                "actor/grad_norm": 1.5,
                "critic/score/mean": 0.3 + 0.1 * step,
                "response_length/mean": 412.0,
                "timing_s/step": 31.0,
                "perf/throughput": 1234.0,
            },
            step=step,
        )
    mlflow.end_run()
    run_id = int(run.info.run_id)
    lab_run = stack.run(run_id)
    assert lab_run["status"] == "succeeded"
    keys = "mismatch/kl_k1,mismatch/kl_k3,policy/clip_frac,reward/mean,perf/throughput"
    metrics = stack.get(f"/api/runs/{run_id}/metrics?keys={keys}")
    assert metrics["steps"] == [1, 2, 3]
    assert metrics["series"]["mismatch/kl_k1"] == pytest.approx([0.001, 0.002, 0.003])
    assert metrics["series"]["mismatch/kl_k3"] == pytest.approx([0.0005, 0.001, 0.0015])
    assert metrics["series"]["reward/mean"] == pytest.approx([0.4, 0.5, 0.6])
    assert metrics["series"]["perf/throughput"] == [1234.0] * 3  # unmapped: as it is
    assert mlflow.get_run(str(run_id)).data.metrics["rollout_corr/kl"] == pytest.approx(0.003)


def test_login_credentials_and_refusals(stack, client_env, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "e2e")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw")
    experiment = mlflow.set_experiment("basic-auth")
    assert mlflow.get_experiment(experiment.experiment_id).name == "basic-auth"

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    with pytest.raises(MlflowException) as wrong:
        mlflow.get_experiment(experiment.experiment_id)
    assert "UNAUTHENTICATED" in str(wrong.value) or "401" in str(wrong.value)

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw")
    with pytest.raises(RestException) as exc:
        mlflow.get_run("999999")
    assert exc.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    with pytest.raises(RestException) as exc:
        mlflow.create_experiment("basic-auth")
    assert exc.value.error_code == "RESOURCE_ALREADY_EXISTS"

    # raw HTTP: no credentials, a bad body, an unknown endpoint
    code, body = _raw(stack, "GET", "/api/2.0/mlflow/experiments/get?experiment_id=1")
    assert (code, body["error_code"]) == (401, "UNAUTHENTICATED")
    auth = "Basic " + base64.b64encode(b"e2e:pw").decode()
    code, body = _raw(stack, "POST", "/api/2.0/mlflow/runs/log-batch", {"run_id": []}, auth)
    assert (code, body["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST") or (
        code,
        body["error_code"],
    ) == (400, "INVALID_PARAMETER_VALUE")
    code, body = _raw(stack, "POST", "/ajax-api/2.0/mlflow/no/such", {}, auth)
    assert (code, body["error_code"]) == (404, "ENDPOINT_NOT_FOUND")
