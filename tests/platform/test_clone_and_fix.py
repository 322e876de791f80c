"""A run that failed on its config (a field error where it was to train: the
worker's path check, or the trainer's exit code 2) keeps those errors by field,
offers "Clone and fix" instead of "Requeue", and the cloned form shows each
error at its field."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from lab.jobs import outcome, supervisor
from lab.jobs import services as job_services
from lab.runs import bulk, lifecycle
from lab.runs.lifecycle import submit_run
from lab.runs.models import Run, RunStatus
from trainer.errors import BAD_INPUT_EXIT_CODE
from trainer.run_folder.files import FIELD_ERRORS_FILE, write_field_errors

ROWS = "".join(
    json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
    for i in range(20)
)


@pytest.fixture
def browser(user):
    client = Client()
    client.force_login(user)
    return client


def _refused_on_its_path(user, experiment, settings, tmp_path) -> Run:
    """Stored before the deployment set its roots; the worker refuses its data file."""
    data = tmp_path / "elsewhere.jsonl"
    data.write_text(ROWS)
    run = submit_run(
        owner=user, experiment=experiment, preset="text-grpo",
        overrides=[f"task.data_file={data}", "run.steps=2"],
    )  # fmt: skip
    (tmp_path / "volume").mkdir()
    settings.LAB_ASSET_ROOTS = [tmp_path / "volume"]
    assert supervisor.execute_claim(job_services.claim_run(run.pk, worker_host="w")) == "failed"
    run.refresh_from_db()
    return run


def test_a_run_refused_on_its_config_keeps_the_errors_by_field_and_cannot_be_requeued(
    user, experiment, settings, tmp_path
):
    run = _refused_on_its_path(user, experiment, settings, tmp_path)
    assert run.failed_on_config
    assert list(run.field_errors) == ["task.data_file"]
    assert "must be inside" in run.field_errors["task.data_file"][0]
    with pytest.raises(lifecycle.InvalidState, match="Clone and fix"):
        bulk.requeue_run(run, user=user)
    assert bulk.requeue_runs([run.pk], user=user).skipped == [run.pk]
    assert Run.objects.get(pk=run.pk).status == RunStatus.FAILED


def test_the_run_page_offers_clone_and_fix_not_requeue(
    browser, user, experiment, settings, tmp_path
):
    run = _refused_on_its_path(user, experiment, settings, tmp_path)
    page = browser.get(f"/runs/{run.pk}/").content.decode()
    assert "Clone and fix" in page and 'data-action="clone-and-fix"' in page
    assert "Requeue (resume" not in page and "Clone with changes" not in page
    assert "<code>task.data_file</code>: must be inside" in page
    # A run that failed otherwise still offers the requeue.
    other = submit_run(owner=user, experiment=experiment, preset="moe-grpo")
    Run.objects.filter(pk=other.pk).update(status=RunStatus.FAILED, error="exit 1")
    assert "Requeue (resume" in browser.get(f"/runs/{other.pk}/").content.decode()


def test_clone_and_fix_opens_the_form_with_the_error_at_its_field(
    browser, user, experiment, settings, tmp_path
):
    run = _refused_on_its_path(user, experiment, settings, tmp_path)
    url = f"/experiments/{experiment.pk}/runs/new"
    page = browser.get(f"{url}?clone={run.pk}").content.decode()
    assert "which failed on its config: fix the fields marked below" in page
    field = re.search(r'<div class="field has-error[^"]*" data-field-path="task.data_file".*?</div>\s*</div>',
                      page, re.S)  # fmt: skip
    assert field is not None, "task.data_file is not marked"
    assert 'aria-invalid="true"' in field.group(0) and "must be inside" in field.group(0)
    assert 'id="f-task.data_file"' in field.group(0) and "autofocus" in field.group(0)
    assert '<a href="#f-task.data_file">task.data_file: must be inside' in page  # the summary
    # Fixed (the file moved into the volume), the clone queues.
    inside = tmp_path / "volume" / "rows.jsonl"
    inside.write_text(ROWS)
    config = {**run.config, "task": {**run.config["task"], "data_file": str(inside)}}
    made = browser.post(url, {"mode": "json", "config_json": json.dumps(config), "queue": "cpu",
                              "start_clone": str(run.pk)})  # fmt: skip
    assert made.status_code == 302, made.content.decode()[-2000:]
    clone = Run.objects.exclude(pk=run.pk).get()
    assert clone.status == RunStatus.QUEUED and clone.field_errors == {}
    assert clone.config["task"]["data_file"] == str(inside)


def test_the_trainers_refusal_is_read_from_the_run_folder(tmp_path):
    write_field_errors(tmp_path, [("task.data_file", "0 usable rows"), ("model.top_k", "> 8")])
    assert outcome.config_field_errors(tmp_path, BAD_INPUT_EXIT_CODE) == {
        "task.data_file": ["0 usable rows"], "model.top_k": ["> 8"],
    }  # fmt: skip
    assert outcome.config_field_errors(tmp_path, 1) is None
    (tmp_path / FIELD_ERRORS_FILE).unlink()
    assert "exit code 2" in outcome.config_field_errors(tmp_path, BAD_INPUT_EXIT_CODE)["__all__"][0]
    write_field_errors(tmp_path / "not-made", [("x", "y")])
    assert not (tmp_path / "not-made").exists()  # a fresh --out stays unwritten


@pytest.mark.slow
def test_a_trainer_that_refuses_its_data_file_fails_the_run_on_that_field(
    user, experiment, tmp_path
):
    """The real trainer: the file was fine at submit and broken by the time it ran."""
    data = tmp_path / "rows.jsonl"
    data.write_text(ROWS)
    run = submit_run(
        owner=user, experiment=experiment, preset="text-grpo",
        overrides=[f"task.data_file={data}", "run.steps=2", "run.threads=1"],
    )  # fmt: skip
    data.write_text("not json\n")
    assert supervisor.execute_claim(job_services.claim_run(run.pk, worker_host="w")) == "failed"
    run.refresh_from_db()
    assert run.failed_on_config and list(run.field_errors) == ["task.data_file"]
    assert "0 usable rows" in run.field_errors["task.data_file"][0]
