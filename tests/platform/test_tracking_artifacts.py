"""MLflow's proxied artifact API (in-process): uploads, listings, downloads and deletes
under a run's and a logged model's artifacts, with the run's rights, bounded sizes
and paths that stay inside the store; on the local folder store and on an
S3-compatible server (moto's server mode, a real S3 API on a local port)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow_rest import Mlflow

from lab.tracking import artifact_store

pytestmark = pytest.mark.slow


@pytest.fixture
def ml(user):
    return Mlflow(user)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server on a free port (a real S3 REST API, in its own process)."""
    pytest.importorskip("moto")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            break
        except OSError:
            time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(timeout=20)


@pytest.fixture(params=["local", "s3"])
def store(request, settings, tmp_path, monkeypatch):
    if request.param == "local":
        settings.LAB_ARTIFACT_STORE = f"file://{tmp_path}/artifacts"
        yield "local"
        return
    import boto3

    endpoint = request.getfixturevalue("s3_server")
    for name, value in (("AWS_ACCESS_KEY_ID", "lab"), ("AWS_SECRET_ACCESS_KEY", "lab"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):  # fmt: skip
        monkeypatch.setenv(name, value)
    bucket = f"lab-{os.getpid()}-{time.monotonic_ns()}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    settings.LAB_ARTIFACT_STORE = f"s3://{bucket}/team"
    settings.LAB_S3_ENDPOINT_URL = endpoint
    yield "s3"


def test_a_runs_artifacts_round_trip(ml, store, other_user, settings):
    exp_id = ml.ok("POST", "experiments/create", {"name": f"art-{store}"})["experiment_id"]
    run = ml.ok("POST", "runs/create", {"experiment_id": exp_id, "run_name": "a"})["run"]["info"]
    assert run["artifact_uri"] == f"mlflow-artifacts:/{exp_id}/{run['run_id']}/artifacts"
    root = f"{exp_id}/{run['run_id']}/artifacts"
    payload = bytes(range(256)) * 1000
    for path, data in ((f"{root}/ckpt/model.bin", payload), (f"{root}/notes.txt", b"hi")):
        code, _ = ml.artifact("PUT", path, data)
        assert code == 200
    code, listed = ml.artifact("GET", "", path=root)
    assert code == 200
    assert listed.json()["files"] == [
        {"path": "ckpt", "is_dir": True},
        {"path": "notes.txt", "is_dir": False, "file_size": 2},
    ]
    code, listed = ml.artifact("GET", "", path=f"{root}/ckpt")
    assert listed.json()["files"] == [
        {"path": "model.bin", "is_dir": False, "file_size": len(payload)}
    ]
    code, got = ml.artifact("GET", f"{root}/ckpt/model.bin")
    assert code == 200 and b"".join(got.streaming_content) == payload
    assert got["Content-Length"] == str(len(payload))
    code, got = ml.artifact("GET", f"{root}/nope.bin")
    assert code == 404 and got.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    listed = ml.ok("GET", "artifacts/list", {"run_id": run["run_id"], "path": "ckpt"})
    assert listed["files"] == [
        {"path": "ckpt/model.bin", "is_dir": False, "file_size": len(payload)}
    ]

    # the run's rights: someone else reads but does not write or delete
    stranger = Mlflow(other_user)
    assert stranger.artifact("GET", f"{root}/notes.txt")[0] == 200
    code, refused = stranger.artifact("PUT", f"{root}/evil.txt", b"x")
    assert (code, refused.json()["error_code"]) == (403, "PERMISSION_DENIED")
    assert stranger.artifact("DELETE", f"{root}/notes.txt")[0] == 403
    # only inside a run's or a logged model's artifacts, never out of the store
    for bad in (
        f"{exp_id}/loose.txt",
        f"{root}/../../x",
        "../etc/passwd",
        f"{exp_id}/999/artifacts/x",
    ):
        code, refused = ml.artifact("PUT", bad, b"x")
        assert code in (400, 403, 404), (bad, code)
    # sizes are bounded
    settings.LAB_MAX_ARTIFACT_BYTES = 1000
    code, refused = ml.artifact("PUT", f"{root}/big.bin", b"x" * 1001)
    assert code == 400 and "too large" in refused.json()["message"]
    code, listed = ml.artifact("GET", "", path=root)
    assert "big.bin" not in str(listed.json())
    assert ml.artifact("DELETE", f"{root}/ckpt")[0] == 200
    code, listed = ml.artifact("GET", "", path=root)
    assert [f["path"] for f in listed.json()["files"]] == ["notes.txt"]


def test_a_logged_model_uploads_and_finalizes(ml, store):
    exp_id = ml.ok("POST", "experiments/create", {"name": f"models-{store}"})["experiment_id"]
    run_id = ml.run(exp_id, "trainer")
    model = ml.ok("POST", "logged-models", {
        "experiment_id": exp_id, "name": "checkpoint-2", "source_run_id": run_id,
        "tags": [{"key": "mlflow.source.name", "value": "train.py"}],
    })["model"]["info"]  # fmt: skip
    assert model["status"] == "LOGGED_MODEL_PENDING" and model["model_id"].startswith("m-")
    root = f"{exp_id}/models/{model['model_id']}/artifacts"
    assert model["artifact_uri"] == f"mlflow-artifacts:/{root}"
    assert ml.artifact("PUT", f"{root}/model.safetensors", b"\0" * 64)[0] == 200
    done = ml.ok("PATCH", f"logged-models/{model['model_id']}", {"status": "LOGGED_MODEL_READY"})
    assert done["model"]["info"]["status"] == "LOGGED_MODEL_READY"
    found = ml.ok("POST", "logged-models/search", {
        "experiment_ids": [exp_id], "filter": "name = 'checkpoint-2'"})["models"]  # fmt: skip
    assert [m["info"]["model_id"] for m in found] == [model["model_id"]]
    listed = ml.ok("GET", f"logged-models/{model['model_id']}/artifacts/directories")
    assert listed["files"] == [{"path": "model.safetensors", "is_dir": False, "file_size": 64}]


def test_the_store_is_chosen_by_its_url(tmp_path):
    local = artifact_store.store_from_url("", tmp_path)
    assert isinstance(local, artifact_store.LocalStore) and local.root == tmp_path
    assert artifact_store.store_from_url(f"file://{tmp_path}/x", Path("/")).root == tmp_path / "x"
    with pytest.raises(ValueError):
        artifact_store.store_from_url("ftp://host/x", tmp_path)
    for bad in ("../x", "/abs", "a/../../b", "a\\b", "a\x00b"):
        with pytest.raises(artifact_store.BadPath):
            artifact_store.clean_path(bad)
    assert artifact_store.clean_path("a//b/./c/") == "a/b/c"
