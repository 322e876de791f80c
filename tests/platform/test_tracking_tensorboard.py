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


def test_histograms_become_expert_loads_or_distributions(tmp_path, user, experiment):
    import numpy as np
    from torch.utils.tensorboard import SummaryWriter

    from lab.runs.metrics.read import metric_series_many
    from lab.tracking.models import TrackedRun
    from trainer import metric_keys as mk

    folder = tmp_path / "hist"
    writer = SummaryWriter(log_dir=str(folder))
    rng = np.random.default_rng(0)
    loads = {}
    for step in range(3):
        for layer in (0, 2):
            # the routed experts' ids of one step's tokens, one bin per expert
            ids = rng.integers(0, 8, size=400)
            writer.add_histogram(
                f"moe/layer_{layer}/expert_ids", ids, step, bins=np.arange(9) - 0.5
            )
            loads[(layer, step)] = np.bincount(ids, minlength=8) / 400
        writer.add_histogram("actor/log_probs", rng.normal(-2.0, 0.5, size=1000), step)
        writer.add_scalar("train/reward", 0.5, step)
        writer.add_image("samples", np.zeros((3, 4, 4)), step)
    writer.close()
    job = TensorBoardImport.start(user=user, experiment_id=experiment.pk, folder=folder)
    job.poll(user)
    run = job.finish(user)
    dist_key = mk.DISTRIBUTION_PREFIX + "actor/log_probs"
    keys = [mk.experts_load(0), mk.experts_load(2), dist_key]
    series = metric_series_many([run.pk], keys)[run.pk].series
    for layer in (0, 2):
        steps, vectors = series[mk.experts_load(layer)]
        assert steps.tolist() == [0, 1, 2]
        for step, vector in zip(steps.tolist(), vectors, strict=True):
            assert vector == pytest.approx(loads[(layer, step)].tolist())
    assert run.config["model"]["n_experts"] == 8 and run.config["model"]["n_layers"] == 3
    assert run.config["model"]["dense_layers"] == [1]
    steps, bands = series[dist_key]
    assert steps.tolist() == [0, 1, 2] and all(
        len(b) == len(mk.DISTRIBUTION_PERCENTS) for b in bands
    )
    median = bands[0][4]
    assert median == pytest.approx(-2.0, abs=0.1)  # the 50% band of N(-2, 0.5)
    assert bands[0][0] < bands[0][2] < median < bands[0][6] < bands[0][8]
    notes = TrackedRun.objects.get(run=run).import_notes
    assert [(n["tag"], n["kind"]) for n in notes] == [("samples", "images")]
