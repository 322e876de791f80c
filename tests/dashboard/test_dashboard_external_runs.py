"""The run page of a run trained elsewhere (in-process): nested runs, artifacts and
logged models with downloads (one file as it is, a folder or a checkpoint as a zip),
the system-metrics panel, distribution panels and the import's skipped lines; and
the time axes of the run and compare charts (wall clock, time since the start)."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from mlflow_rest import Mlflow

from lab.tracking import services
from lab.tracking.models import TrackedRun
from trainer import metric_keys as mk

pytestmark = pytest.mark.slow
T0 = 1_700_000_000_000


@pytest.fixture
def logged(user, settings, tmp_path):
    """An MLflow run with metrics at their own times, system metrics, files, a logged
    checkpoint, a child run, an imported distribution and a skipped text summary."""
    settings.LAB_ARTIFACT_STORE = f"file://{tmp_path}/artifacts"
    ml = Mlflow(user)
    exp_id = ml.ok("POST", "experiments/create", {"name": "hub"})["experiment_id"]
    run_id = ml.ok("POST", "runs/create", {
        "experiment_id": exp_id, "run_name": "parent", "start_time": T0,
        "tags": [{"key": "lab.framework", "value": "trl"}],
    })["run"]["info"]["run_id"]  # fmt: skip
    points = [
        {"key": "reward", "value": 0.1 * s, "timestamp": T0 + 60_000 * s, "step": s} for s in range(1, 6)
    ] + [
        {"key": "system/cpu_utilization_percentage", "value": 40.0 + s, "timestamp": T0 + 10_000 * s, "step": s}
        for s in range(10)
    ]  # fmt: skip
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": points})
    root = f"{exp_id}/{run_id}/artifacts"
    ml.artifact("PUT", f"{root}/config/train.json", b'{"lr": 1}')
    ml.artifact("PUT", f"{root}/notes.txt", b"hello")
    model = ml.ok("POST", "logged-models", {
        "experiment_id": exp_id, "name": "checkpoint-5", "source_run_id": run_id})["model"]["info"]  # fmt: skip
    model_root = f"{exp_id}/models/{model['model_id']}/artifacts"
    ml.artifact("PUT", f"{model_root}/artifacts/checkpoint-5/model.safetensors", b"\0" * 100)
    ml.artifact("PUT", f"{model_root}/MLmodel", b"flavors: {}")
    ml.ok("PATCH", f"logged-models/{model['model_id']}", {"status": "LOGGED_MODEL_READY"})
    child = ml.run(exp_id, "trial0", tags={"mlflow.parentRunId": run_id, "seed": "3"})
    services.log_vectors(user=user, run_id=run_id, by_step={
        s: {mk.DISTRIBUTION_PREFIX + "actor/log_probs": [s - 2.0 + 0.5 * i for i in range(9)]}
        for s in range(1, 4)})  # fmt: skip
    services.set_import_notes(user=user, run_id=run_id, notes=[
        {"tag": "train/generated_samples", "kind": "text", "reason": "text is not a metric"}])  # fmt: skip
    return {"run": run_id, "child": child, "model": model["model_id"], "exp": exp_id}


def test_the_run_page_shows_what_the_client_logged(alice, logged):
    html = alice.get(f"/runs/{logged['run']}/").content.decode()
    assert f'href="/runs/{logged["child"]}/"' in html.split('data-field="children"')[1]
    assert "train/generated_samples" in html.split('data-field="import-notes"')[1]
    files = html.split('data-field="artifacts"')[1].split("</section>")[0]
    assert "config/train.json" in files and "notes.txt" in files and "checkpoint-5" in files
    system = html.split('data-field="system-metrics"')[1].split("</section>")[0]
    assert "key=system%2Fcpu_utilization_percentage" in system and "x=wall" in system
    assert "/distribution?key=dist%2Factor%2Flog_probs" in html
    child_page = alice.get(f"/runs/{logged['child']}/").content.decode()
    assert (
        f'href="/runs/{logged["run"]}/"'
        in child_page.split('data-field="parent"')[0][-200:]
        + child_page.split('data-field="parent"')[1][:200]
    )


def test_artifacts_and_checkpoints_download(alice, logged, client_for, other_user):
    one = alice.get(f"/runs/{logged['run']}/artifacts", {"path": "notes.txt"})
    assert one.status_code == 200 and b"".join(one.streaming_content) == b"hello"
    everything = alice.get(f"/runs/{logged['run']}/artifacts")
    archive = zipfile.ZipFile(io.BytesIO(b"".join(everything.streaming_content)))
    assert sorted(archive.namelist()) == ["config/train.json", "notes.txt"]
    assert archive.read("config/train.json") == b'{"lr": 1}'
    checkpoint = alice.get(f"/runs/{logged['run']}/models/{logged['model']}")
    archive = zipfile.ZipFile(io.BytesIO(b"".join(checkpoint.streaming_content)))
    assert sorted(archive.namelist()) == ["MLmodel", "artifacts/checkpoint-5/model.safetensors"]
    assert alice.get(f"/runs/{logged['run']}/artifacts", {"path": "../../x"}).status_code == 404
    assert alice.get(f"/runs/{logged['run']}/artifacts", {"path": "nope"}).status_code == 404
    # anyone logged in reads; nobody logged out does
    assert (
        client_for(other_user)
        .get(f"/runs/{logged['run']}/artifacts", {"path": "notes.txt"})
        .status_code
        == 200
    )


def test_distribution_panel(alice, logged):
    got = alice.get(
        f"/runs/{logged['run']}/distribution", {"key": "dist/actor/log_probs", "format": "json"}
    )
    traces = json.loads(got.content)["traces"]
    median = next(t for t in traces if t["name"] == "median")
    assert median["x"] == [1, 2, 3] and median["y"] == pytest.approx([1.0, 2.0, 3.0])


def _x(client, url, **params) -> list:
    """The first trace's x values, from the chart's JSON download."""
    return json.loads(client.get(url, {**params, "format": "json"}).content)["traces"][0]["x"]


def _layout(client, url, **params) -> dict:
    return json.loads(client.get(url, params).content)["figure"]["layout"]


def test_charts_on_wall_clock_and_relative_time(alice, logged):
    run_id = logged["run"]
    chart = f"/runs/{run_id}/chart"
    assert _x(alice, chart, key="reward/mean") == [1, 2, 3, 4, 5]
    assert _layout(alice, chart, key="reward/mean", x="wall")["xaxis"]["type"] == "date"
    assert _x(alice, chart, key="reward/mean", x="wall") == [T0 + 60_000 * s for s in range(1, 6)]
    start = TrackedRun.objects.get(run_id=run_id).start_time
    assert _x(alice, chart, key="reward/mean", x="relative") == pytest.approx(
        [(T0 + 60_000 * s - start) / 60_000 for s in range(1, 6)]
    )
    assert "min" in _layout(alice, chart, key="reward/mean", x="relative")["xaxis"]["title"]["text"]
    cpu = "system/cpu_utilization_percentage"
    assert _x(alice, chart, key=cpu, x="wall") == [T0 + 10_000 * s for s in range(10)]
    compared = json.loads(
        alice.get("/compare/charts", {"runs": run_id, "keys": "reward/mean", "x": "wall"}).content
    )
    assert compared["charts"]["reward/mean"]["figure"]["layout"]["xaxis"]["type"] == "date"
    assert alice.get(chart, {"key": "reward/mean", "x": "sideways"}).status_code == 400
    page = alice.get(f"/runs/{run_id}/", {"x": "relative"}).content.decode()
    assert "x=relative" in page.split("chart-section")[1]


def test_lab_run_charts_use_the_trainers_wall_clock(alice, make_run):
    records = [
        {"step": s, "reward/accuracy": 0.5, mk.TIME_WALL: 1_700_000_000.0 + 30 * s}
        for s in range(4)
    ]
    run = make_run(records=records)
    got = _x(alice, f"/runs/{run.pk}/chart", key="reward/accuracy", x="wall")
    assert got == [1_700_000_000_000 + 30_000 * s for s in range(4)]
