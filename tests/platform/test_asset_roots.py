"""One check of every path a user names against LAB_ASSET_ROOTS (registration,
a run's ``task.data_file`` / ``task.eval_file`` / ``model.source`` through the
API, the form and ``manage.py submit``, and the worker before it opens them),
refusals that reveal nothing about the path, ``check --deploy``'s warning,
bounded prompt templates, and the API's idempotency and strictness rules."""

from __future__ import annotations

import json
import tracemalloc
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import Client

from lab.assets.roots import check_path, default_asset_roots
from lab.assets.system_checks import NO_ROOTS
from lab.experiments.models import Experiment
from lab.jobs import services as job_services
from lab.jobs import supervisor
from lab.runs.lifecycle import submit_run
from lab.runs.models import Run
from trainer.errors import FieldError
from trainer.tasks.text_data import SHIPPED_DATA

ROWS = "".join(
    json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
    for i in range(20)
)


@pytest.fixture
def volume(tmp_path, settings) -> Path:
    """A deployment whose models and data live in ``volume``; ``secret`` is outside."""
    (tmp_path / "volume").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "volume" / "train.jsonl").write_text(ROWS)
    (tmp_path / "secret" / "train.jsonl").write_text(ROWS)
    settings.LAB_ASSET_ROOTS = [tmp_path / "volume"]
    return tmp_path / "volume"


def _text_run(experiment, **task) -> dict:
    return {
        "experiment": experiment.pk,
        "preset": "text-grpo",
        "overrides": {f"task.{k}": v for k, v in task.items()} | {"run.steps": 2},
    }


def test_a_run_may_name_files_inside_the_roots_only(api, experiment, volume):
    inside = api.post(
        "/api/runs", _text_run(experiment, data_file=str(volume / "train.jsonl")), format="json"
    )
    assert inside.status_code == 201, inside.content
    secret = volume.parent / "secret"
    for field, value in [
        ("data_file", str(secret / "train.jsonl")),
        ("eval_file", str(secret / "train.jsonl")),
        ("data_file", str(volume / ".." / "secret" / "train.jsonl")),  # '..' resolved first
        ("data_file", "../../../../etc/passwd.jsonl"),  # a "shipped" name leading out
    ]:
        response = api.post("/api/runs", _text_run(experiment, **{field: value}), format="json")
        assert response.status_code == 400, response.content
        assert "LAB_ASSET_ROOTS" in response.json()["errors"][f"config.task.{field}"][0]
    (volume / "link.jsonl").symlink_to(secret / "train.jsonl")  # a symlink out
    linked = api.post(
        "/api/runs", _text_run(experiment, data_file=str(volume / "link.jsonl")), format="json"
    )
    assert "LAB_ASSET_ROOTS" in linked.json()["errors"]["config.task.data_file"][0]
    model = api.post(
        "/api/runs",
        {"experiment": experiment.pk, "preset": "moe-grpo", "overrides": {"model.source": "/etc"}},
        format="json",
    )
    assert "LAB_ASSET_ROOTS" in model.json()["errors"]["config.model.source"][0]
    shipped = api.post(
        "/api/runs", _text_run(experiment, data_file="word_problems.jsonl"), format="json"
    )
    assert shipped.status_code == 201, shipped.content  # the lab's own files stay usable
    assert Run.objects.count() == 2


def test_a_refusal_says_nothing_about_the_path(api, experiment, volume):
    """An existing file, a missing one and a folder outside the roots get the same
    words: whether it exists, or how many rows it has, never leaks."""
    secret = volume.parent / "secret"
    messages = set()
    for value in [secret / "train.jsonl", secret / "absent.jsonl", secret, Path("/etc/shadow")]:
        for url, body in [
            ("/api/runs", _text_run(experiment, data_file=str(value))),
            ("/api/datasets", {"name": "d", "path": str(value)}),
            ("/api/models", {"name": "m", "path": str(value)}),
        ]:
            response = api.post(url, body, format="json")
            assert response.status_code == 400
            errors = response.json()["errors"]
            (message,) = errors.get("config.task.data_file") or errors["path"]
            # The roots may be named (their digits are the temporary folder's, e.g.
            # pytest-20); the file's 20 rows may not.
            assert str(value) not in message
            assert "20" not in message.replace(str(volume), "ROOT")
            messages.add(message)
    assert messages == {f"must be inside {volume} (LAB_ASSET_ROOTS)"}


def test_experiments_forms_and_the_cli_refuse_alike(api, user, experiment, volume):
    outside = str(volume.parent / "secret" / "train.jsonl")
    task = {"task": {"name": "text", "data_file": outside}}
    made = api.post(
        "/api/experiments", {"name": "x", "preset": "moe-grpo", "overrides": task}, format="json"
    )
    assert "LAB_ASSET_ROOTS" in made.json()["errors"]["config.task.data_file"][0]
    client = Client()
    client.force_login(user)
    config = {"task": {"name": "text", "data_file": outside}}
    page = client.post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "config_json": json.dumps(config), "queue": "cpu", "priority": "0"},
    )
    assert page.status_code == 200 and "LAB_ASSET_ROOTS" in page.content.decode()
    get_user_model().objects.create_superuser("root", password="pw")
    out = StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command(
            "submit", "--preset", "text-grpo", "--set", f"task.data_file={outside}",
            stdout=out, stderr=out,
        )  # fmt: skip
    assert exit_info.value.code == 2
    assert "task.data_file: must be inside" in out.getvalue()
    assert Run.objects.count() == 0 and Experiment.objects.count() == 1


def test_the_worker_checks_the_paths_again_before_the_trainer_opens_them(
    user, experiment, settings, tmp_path
):
    """A run stored before the roots were set (or by a server with other roots)
    fails on the worker with the field error, without starting the trainer."""
    data = tmp_path / "elsewhere.jsonl"
    data.write_text(ROWS)
    run = submit_run(
        owner=user, experiment=experiment, preset="text-grpo",
        overrides=[f"task.data_file={data}", "run.steps=2"],
    )  # fmt: skip
    settings.LAB_ASSET_ROOTS = [tmp_path / "volume"]
    claim = job_services.claim_run(run.pk, worker_host="w")
    assert supervisor.execute_claim(claim) == "failed"
    run.refresh_from_db()
    assert run.status == "failed" and "task.data_file: must be inside" in run.error
    assert str(run.run_dir) in run.error  # the failure names the path involved
    assert not (Path(run.run_dir) / "trainer.log").exists()  # no trainer was started


def test_check_deploy_warns_about_a_deployment_without_roots(settings, tmp_path):
    settings.LAB_ASSET_ROOTS = []
    warnings = [m.id for m in run_checks(include_deployment_checks=True)]
    assert NO_ROOTS in warnings
    settings.LAB_ASSET_ROOTS = default_asset_roots(tmp_path)
    assert NO_ROOTS not in [m.id for m in run_checks(include_deployment_checks=True)]
    assert NO_ROOTS not in [m.id for m in run_checks()]  # a deploy check only


def test_make_ups_default_roots_are_the_shipped_data_and_var(settings, tmp_path):
    settings.LAB_ASSET_ROOTS = default_asset_roots(tmp_path / "var")
    assert check_path("path", str(tmp_path / "var" / "data" / "x.jsonl"))
    assert check_path("task.data_file", "word_problems.jsonl", shipped_names=True)
    assert check_path("task.data_file", str(SHIPPED_DATA / "word_problems.jsonl"))
    with pytest.raises(FieldError, match="LAB_ASSET_ROOTS"):
        check_path("path", str(tmp_path / "x.jsonl"))


# ----------------------------------------------------------------- prompt templates

WIDE = "{question:>10000000}"


@pytest.mark.parametrize(
    "template, words",
    [
        (WIDE, "widths and precisions up to 1000"),
        ("{question:.100000}", "widths and precisions up to 1000"),
        ("{question:{answer}}", "no fields inside a format spec"),
        ("{question.__class__}", "name a row field only"),
        ("{0}", "name a row field only"),
        ("{question", "not a format string"),
    ],
)
def test_a_costly_template_is_refused_at_submission(api, experiment, template, words):
    response = api.post("/api/runs", _text_run(experiment, prompt_template=template), format="json")
    assert response.status_code == 400, response.content
    # The trainer's schema refuses every format spec (trainer.tasks.text); the
    # platform's own words are reached only where the schema lets a template pass.
    assert response.json()["errors"]["config.task.prompt_template"][0]
    dataset = api.post(
        "/api/datasets",
        {"name": "d", "path": "word_problems.jsonl", "prompt_template": template},
        format="json",
    )
    assert dataset.json()["errors"]["prompt_template"][0]
    assert Run.objects.count() == 0


def test_a_refused_template_costs_the_web_process_almost_nothing(api, experiment):
    """The request that once cost +477 MB: refused before any row is formatted."""
    tracemalloc.start()
    try:
        response = api.post("/api/runs", _text_run(experiment, prompt_template=WIDE), format="json")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 400
    assert peak < 20 * 1024**2, f"peak {peak / 1024**2:.1f} MB"


def test_a_modest_template_is_accepted(api, experiment):
    ok = api.post(
        "/api/runs", _text_run(experiment, prompt_template="Q: {question}\nA:"), format="json"
    )
    assert ok.status_code == 201, ok.content


# ----------------------------------------------------------------- idempotency, strictness


def test_a_reused_idempotency_key_with_another_body_is_a_422(api, experiment):
    body = {"experiment": experiment.pk, "preset": "moe-grpo", "overrides": {"run.steps": 3}}
    headers = {"HTTP_IDEMPOTENCY_KEY": "k-1"}
    first = api.post("/api/runs", body, format="json", **headers)
    again = api.post("/api/runs", body, format="json", **headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    for changed in [
        body | {"overrides": {"run.steps": 4}},
        body | {"priority": 2},
        body | {"preset": "dense-grpo"},
    ]:
        other = api.post("/api/runs", changed, format="json", **headers)
        assert other.status_code == 422, other.content
        assert f"run {first.json()['id']}" in other.json()["errors"]["Idempotency-Key"][0]
    # the same request spelled differently (overrides as a list) is the same request
    same = api.post("/api/runs", body | {"overrides": ["run.steps=3"]}, format="json", **headers)
    assert same.status_code == 200
    assert Run.objects.count() == 1


def test_the_export_endpoint_refuses_unknown_fields(api, user, experiment):
    run = submit_run(owner=user, experiment=experiment, preset="moe-grpo")
    response = api.post(
        f"/api/runs/{run.pk}/exports", {"dtype": "float32", "out": "/tmp/x"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["errors"] == {"out": ["unknown field"]}
