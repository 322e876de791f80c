"""TensorBoard event files (written by torch's SummaryWriter, as slime and OpenRLHF
write them) imported with TensorBoard's own reader: from the CLI, from the API, and a
folder still being written followed without storing a point twice."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from rest_framework.authtoken.models import Token

from lab.runs.models import MetricStep, Run
from lab.tracking.tensorboard import TensorBoardImport

pytest.importorskip("tensorboard")
pytestmark = pytest.mark.slow


def _write(folder, steps, start=0):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    for step in range(start, start + steps):
        writer.add_scalar("train/vllm_kl", 0.001 * step, step)  # OpenRLHF's names
        writer.add_scalar("train/reward", 0.5, step)
        writer.add_scalar("train/custom", float(step), step)
    writer.close()


def test_cli_import_and_follow(tmp_path, user, experiment):
    folder = tmp_path / "openrlhf-run"
    _write(folder, 4)
    call_command(
        "import_tensorboard", str(folder), "--experiment", str(experiment.pk), "--user", "alice"
    )
    run = Run.objects.get(experiment=experiment, origin="external")
    assert run.status == "succeeded" and run.source["framework"] == "openrlhf"
    assert MetricStep.objects.get(run=run, step=3).values == pytest.approx(
        {"mismatch/kl_k1": 0.003, "reward/mean": 0.5, "train/custom": 3.0}
    )

    # a folder still being written: each poll stores only what is new
    live = tmp_path / "live"
    _write(live, 2)
    job = TensorBoardImport.start(user=user, experiment_id=experiment.pk, folder=live)
    assert job.poll(user) == 6
    assert job.poll(user) == 0
    _write(live, 3, start=2)  # the trainer goes on (a new event file, as after a restart)
    assert job.poll(user) == 9
    assert sorted(MetricStep.objects.filter(run=job.run).values_list("step", flat=True)) == [
        0, 1, 2, 3, 4,
    ]  # fmt: skip
    assert job.finish(user).status == "succeeded"

    with pytest.raises(CommandError) as exc:
        call_command(
            "import_tensorboard", str(tmp_path / "nope"), "--experiment", "1", "--user", "alice"
        )
    assert exc.value.returncode == 2


def test_api_import_inside_the_asset_roots(tmp_path, user, experiment, settings):
    settings.LAB_ASSET_ROOTS = [tmp_path / "data"]
    folder = tmp_path / "data" / "slime"
    _write(folder, 2)
    client = Client(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")

    def post(body):
        resp = client.post(
            "/api/tracking/tensorboard", json.dumps(body), content_type="application/json"
        )
        return resp.status_code, resp.json()

    code, data = post({"experiment_id": experiment.pk, "path": str(folder), "final": False})
    assert (code, data["points"], data["status"]) == (200, 6, "running")
    code, again = post({"run_id": data["run_id"], "path": str(folder)})
    assert (code, again["run_id"], again["status"]) == (200, data["run_id"], "succeeded")
    assert MetricStep.objects.filter(run_id=int(data["run_id"])).count() == 2

    outside = tmp_path / "elsewhere"
    _write(outside, 1)
    code, data = post({"experiment_id": experiment.pk, "path": str(outside)})
    assert (code, data["error_code"]) == (400, "INVALID_PARAMETER_VALUE")
    assert "LAB_ASSET_ROOTS" in data["message"]
