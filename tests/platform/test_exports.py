"""Exports from the platform: a finished run's checkpoint becomes a Hugging Face
folder, requested on the run page or the API and written by the control
queue's worker (the task's body, runs/exports.run_export, runs here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lab_processes import submit_tiny_run

from lab.runs import exports
from lab.runs.models import ExportStatus, RunStatus
from trainer.errors import FieldError
from trainer.run.runner import train
from trainer.validation import validate_config

pytestmark = [pytest.mark.slow, pytest.mark.database]


@pytest.fixture
def finished_run(user, experiment, settings, tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))
    settings.RUNS_DIR = tmp_path / "runs"
    run = submit_tiny_run(user, experiment)
    summary = train(validate_config(run.config), Path(run.run_dir))
    run.status, run.summary, run.current_step = RunStatus.SUCCEEDED, summary, summary["steps"]
    run.save()
    return run


def test_export_from_the_page_writes_a_folder_transformers_reads(client, user, finished_run):
    client.force_login(user)
    page = client.get(f"/runs/{finished_run.pk}/").content.decode()
    assert "Export the checkpoint" in page
    client.post(f"/runs/{finished_run.pk}/export", {"dtype": "bfloat16"})
    export = finished_run.exports.get()
    assert (export.status, export.dtype, export.step) == ("queued", "bfloat16", 3)
    assert exports.run_export(export.pk) == ExportStatus.SUCCEEDED
    assert exports.run_export(export.pk) == "skipped"  # a repeated delivery does nothing
    export.refresh_from_db()
    folder = Path(export.out_dir)
    assert folder.parent == Path(finished_run.run_dir) / "exports"
    config = json.loads((folder / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" or config.get("dtype") == "bfloat16"
    assert list(folder.glob("*.safetensors"))
    page = client.get(f"/runs/{finished_run.pk}/").content.decode()
    assert export.out_dir in page and "succeeded" in page


def test_export_api_and_its_field_errors(api, other_api, finished_run):
    url = f"/api/runs/{finished_run.pk}/exports"
    bad = api.post(url, {"dtype": "int4"}, format="json")
    assert bad.status_code == 400 and "dtype" in bad.json()["errors"]
    assert other_api.post(url, {}, format="json").status_code == 403  # not a member
    first = api.post(url, {}, format="json")
    assert first.status_code == 202 and first.json()["status"] == "queued"
    again = api.post(url, {}, format="json")
    assert again.json()["id"] == first.json()["id"]  # the same export, not a second one
    assert [e["id"] for e in api.get(url).json()] == [first.json()["id"]]


def test_an_active_run_cannot_be_exported(user, experiment):
    run = submit_tiny_run(user, experiment)
    with pytest.raises(FieldError, match="only a finished run with a checkpoint"):
        exports.request_export(run, user=user)


def test_a_checkpoint_gone_meanwhile_fails_the_export_with_the_reason(user, finished_run):
    export = exports.request_export(finished_run, user=user)
    for path in Path(finished_run.run_dir, "checkpoints").iterdir():
        path.unlink()
    assert exports.run_export(export.pk) == ExportStatus.FAILED
    export.refresh_from_db()
    assert "has no checkpoint" in export.error


def test_an_export_asked_again_after_a_failure_replaces_what_the_failure_left(user, finished_run):
    first = exports.request_export(finished_run, user=user)
    folder = Path(first.out_dir)
    folder.mkdir(parents=True)
    (folder / "model-00001-of-00009.safetensors").write_bytes(b"a stale shard")
    exports.claim_export(first.pk)
    exports.finish_export(first, "the worker was lost")
    second = exports.request_export(finished_run, user=user)
    assert second.pk != first.pk and second.out_dir == first.out_dir
    assert exports.run_export(second.pk) == ExportStatus.SUCCEEDED
    assert not (folder / "model-00001-of-00009.safetensors").exists()
    assert (folder / "config.json").exists()


def test_the_export_dtypes_the_platform_offers_are_the_exporters():
    """lab.runs.exports keeps the names (the web process loads no torch); the
    exporter's table is the truth."""
    from lab.runs.exports import EXPORT_DTYPES
    from trainer.hf.export import DTYPES

    assert list(EXPORT_DTYPES) == list(DTYPES)
