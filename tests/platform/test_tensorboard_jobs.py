"""TensorBoard imports as jobs: a large folder is imported by the control queue's
worker, not in the request; a truncated, corrupt, empty or random file ends the
import failed or succeeded with the points read and skipped and each file's
problem; a NaN or Inf scalar is a gap, not a crash; nothing is left running."""

from __future__ import annotations

import json
import os
import random
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

from lab.runs.models import MetricStep, Run, RunStatus
from lab.tracking import tb_jobs
from lab.tracking.models import ImportStatus, TensorBoardImportJob
from lab.tracking.tb_files import event_files, scan_folder

pytest.importorskip("tensorboard")
pytestmark = pytest.mark.slow


def write_events(folder, steps: int, values=None) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    for step in range(steps):
        value = values[step] if values else 0.01 * step
        writer.add_scalar("train/reward", value, step)
        writer.add_scalar("train/loss", 1.0, step)
    writer.close()


@pytest.fixture
def api(user):
    client = Client(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")

    def post(body):
        response = client.post(
            "/api/tracking/tensorboard", json.dumps(body), content_type="application/json"
        )
        return response.status_code, response.json()

    post.get = lambda path: client.get(path)  # type: ignore[attr-defined]
    return post


def _one_file(folder):
    (path,) = event_files(folder)
    return path


def _import(api, experiment, folder, **body):
    code, data = api({"experiment_id": experiment.pk, "path": str(folder), **body})
    assert code == 200, data
    return data


def _no_run_left_running():
    assert not Run.objects.filter(origin="external", status=RunStatus.RUNNING).exists()
    assert not TensorBoardImportJob.objects.filter(
        status__in=[ImportStatus.QUEUED, ImportStatus.RUNNING]
    ).exists()


def test_a_sound_file_succeeds_with_its_counts(api, experiment, tmp_path):
    write_events(tmp_path / "ok", 20)
    data = _import(api, experiment, tmp_path / "ok")
    assert data["import_status"] == "succeeded" and data["status"] == "succeeded"
    assert data["points"] == 40 and data["skipped"] == 0 and data["error"] == ""
    (report,) = data["files"]
    assert report["records"] == 41 and report["problem"] == ""  # + the file_version event
    _no_run_left_running()


def test_a_truncated_file_keeps_what_it_read_and_says_where_it_stops(api, experiment, tmp_path):
    write_events(tmp_path / "cut", 20)
    path = _one_file(tmp_path / "cut")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    result = _import(api, experiment, tmp_path / "cut")
    assert result["import_status"] == "succeeded" and 0 < result["points"] < 40
    assert "truncated" in result["error"] and "truncated" in result["files"][0]["problem"]
    # The same cut while the folder is followed (final false) is no problem: still written.
    followed = _import(api, experiment, tmp_path / "cut", final=False)
    assert followed["import_status"] == "succeeded" and followed["error"] == ""
    assert followed["status"] == "running"


def test_a_corrupt_record_is_named(api, experiment, tmp_path):
    write_events(tmp_path / "bad", 20)
    path = _one_file(tmp_path / "bad")
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = b"\xff\xff\xff\xff"
    path.write_bytes(bytes(data))
    result = _import(api, experiment, tmp_path / "bad")
    problem = result["files"][0]["problem"]
    assert "corrupt" in problem or "not an event record" in problem, result
    assert result["import_status"] in ("succeeded", "failed")
    assert result["status"] == result["import_status"]  # the run ends with it
    _no_run_left_running()


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", "empty: no event record"),
        (bytes(random.Random(0).getrandbits(8) for _ in range(5000)), "not an event record"),
        (b"\x00" * 7, "truncated"),
    ],
    ids=["empty", "random", "seven-bytes"],
)
def test_a_file_with_nothing_to_import_fails_the_import_and_the_run(
    api, experiment, tmp_path, content, why
):
    folder = tmp_path / "junk"
    folder.mkdir()
    (folder / "events.out.tfevents.1.host").write_bytes(content)
    result = _import(api, experiment, folder)
    assert result["import_status"] == "failed" and result["status"] == "failed"
    assert result["points"] == 0 and why in result["error"], result
    assert Run.objects.get(pk=result["run_id"]).error.startswith("TensorBoard import:")
    _no_run_left_running()


def test_a_folder_without_event_files_or_scalars_fails(api, experiment, tmp_path):
    (tmp_path / "none").mkdir()
    result = _import(api, experiment, tmp_path / "none")
    assert result["import_status"] == "failed" and "no event file" in result["error"]
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "text"))
    writer.add_text("notes", "hello", 0)
    writer.close()
    result = _import(api, experiment, tmp_path / "text")
    assert result["import_status"] == "failed" and "nothing to import" in result["error"]
    assert result["not_imported"] and result["not_imported"][0]["kind"] == "text"
    _no_run_left_running()


def test_nan_and_inf_are_stored_as_gaps(api, experiment, tmp_path):
    values = [0.1, float("nan"), 0.3, float("inf"), float("-inf"), 0.6]
    write_events(tmp_path / "nan", len(values), values)
    result = _import(api, experiment, tmp_path / "nan")
    assert result["import_status"] == "succeeded" and result["points"] == 12
    stored = {
        row.step: row.values.get("reward/mean", row.values.get("train/reward"))
        for row in MetricStep.objects.filter(run_id=result["run_id"])
    }
    assert stored[0] == pytest.approx(0.1) and stored[2] == pytest.approx(0.3)
    assert stored[1] is None and stored[3] is None and stored[4] is None


def test_a_large_folder_is_queued_for_the_worker_and_followed(api, experiment, tmp_path, settings):
    settings.LAB_TENSORBOARD_INLINE_BYTES = 0  # every folder counts as large
    write_events(tmp_path / "big", 30)
    queued = _import(api, experiment, tmp_path / "big")
    assert queued["import_status"] == "queued" and queued["points"] == 0
    assert queued["status"] == "running"  # the run exists at once
    job_id = int(queued["import_id"])
    assert tb_jobs.run_import(job_id) == ImportStatus.SUCCEEDED  # the control worker's call
    assert tb_jobs.run_import(job_id) == "skipped"  # a repeated delivery
    status = api.get(f"/api/tracking/tensorboard/status?import_id={job_id}").json()
    assert status["import_status"] == "succeeded" and status["points"] == 60
    assert status["status"] == "succeeded"
    assert api.get("/api/tracking/tensorboard/status?import_id=999999").status_code == 404
    _no_run_left_running()


def test_the_reconciler_ends_an_import_whose_worker_died(api, experiment, tmp_path, settings):
    settings.LAB_TENSORBOARD_INLINE_BYTES = 0
    write_events(tmp_path / "big", 3)
    job_id = int(_import(api, experiment, tmp_path / "big")["import_id"])
    long_ago = timezone.now() - timedelta(hours=3)
    TensorBoardImportJob.objects.filter(pk=job_id).update(
        status=ImportStatus.RUNNING, started_at=long_ago, heartbeat_at=long_ago
    )
    assert (job_id, "failed") in tb_jobs.reconcile_imports()
    job = TensorBoardImportJob.objects.get(pk=job_id)
    assert job.status == ImportStatus.FAILED and "stopped" in job.error
    assert job.run.status == RunStatus.FAILED
    # A queued job whose message was lost is sent again.
    queued = int(_import(api, experiment, tmp_path / "big")["import_id"])
    TensorBoardImportJob.objects.filter(pk=queued).update(created_at=long_ago)
    assert (queued, "republished") in tb_jobs.reconcile_imports()


def test_the_scan_counts_records(tmp_path):
    write_events(tmp_path / "s", 5)
    (report,) = scan_folder(tmp_path / "s")
    assert report.records == 11 and report.problem == "" and report.bytes > 0
    assert os.path.basename(report.file).startswith("events.out.tfevents")


@pytest.mark.e2e
def test_a_large_import_runs_on_the_control_worker_of_a_real_stack(tmp_path):
    """100,000 scalars (about 5 MB): the request answers at once (queued), the
    control queue's worker imports them, and the status endpoint follows it."""
    import time
    import urllib.request

    from lab_processes import LabStack
    from torch.utils.tensorboard import SummaryWriter

    folder = tmp_path / "data" / "big"
    writer = SummaryWriter(log_dir=str(folder))
    for step in range(50_000):
        writer.add_scalar("train/reward", 0.5, step)
        writer.add_scalar("train/loss", float("nan") if step % 1000 == 7 else 1.0, step)
    writer.close()
    stack = LabStack(tmp_path / "stack", "filesystem")
    try:
        stack.start_reconciler()
        experiment = stack.post("/api/experiments", {"name": "tb"})["id"]
        t0 = time.monotonic()
        code, queued = stack.request(
            "POST", "/api/tracking/tensorboard", {"experiment_id": experiment, "path": str(folder)}
        )
        answered_s = time.monotonic() - t0
        assert code == 200 and queued["import_status"] == "queued", queued
        assert answered_s < 10

        def status():
            request = urllib.request.Request(
                f"http://127.0.0.1:{stack.port}/api/tracking/tensorboard/status?import_id={queued['import_id']}",
                headers={"Authorization": f"Token {stack.token}"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                body = json.loads(response.read())
            return body if body["import_status"] in ("succeeded", "failed") else None

        done = stack.wait_for(status, 600, "the import to end", every=1.0)
        assert done["import_status"] == "succeeded" and done["points"] == 100_000, done
        assert done["status"] == "succeeded", stack.log("reconciler")
        print(f"request answered in {answered_s:.2f} s; imported in {time.monotonic() - t0:.1f} s")
    finally:
        stack.close()
