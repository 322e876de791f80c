"""The registry of models and datasets: checks on registration (field errors), the
API and the page, runs that pick a registered model and dataset, and the run and
compare pages' model facts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client
from hf_tiny_checkpoints import save_char_tokenizer, save_hf_checkpoint, word_problem_characters

from lab.assets.models import RegisteredDataset, RegisteredModel
from lab.runs.lifecycle import submit_run
from lab.runs.models import Run
from trainer.config import ExperimentConfig
from trainer.model.transformer import TransformerLM
from trainer.tasks.text_data import SHIPPED_DATA

WORD_PROBLEMS = str(SHIPPED_DATA / "word_problems.jsonl")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qwen3moe")
    save_hf_checkpoint("qwen3_moe", folder)
    save_char_tokenizer(folder, word_problem_characters())
    return folder


def _errors(response) -> dict[str, list[str]]:
    assert response.status_code == 400, response.content
    return json.loads(response.content)["errors"]


def test_register_a_model_with_its_family_and_parameter_counts(api, checkpoint):
    response = api.post("/api/models", {"name": "q3", "path": str(checkpoint)}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["family"] == "qwen3_moe" and body["vocab_size"] == 59
    # the counts are the built model's: every parameter, and top-2 of 8 experts in MoE blocks
    cfg = ExperimentConfig.model_validate({"model": body["model_fields"]})
    model = TransformerLM(cfg.model, cfg.model.vocab_size)
    assert body["total_params"] == sum(p.numel() for p in model.parameters())
    moe_blocks = cfg.model.n_moe_blocks  # 2 of 3: block 1 is dense (mlp_only_layers)
    unused = moe_blocks * 6 * 3 * cfg.model.d_model * cfg.model.expert_hidden
    assert body["total_params"] - body["active_params"] == unused
    assert api.get(f"/api/models/{body['id']}").json()["name"] == "q3"
    assert [m["name"] for m in api.get("/api/models").json()["results"]] == ["q3"]


def test_model_registration_errors_name_the_field(api, checkpoint, tmp_path):
    def post(**data):
        return api.post("/api/models", {"name": "m", **data}, format="json")

    assert "not a folder" in _errors(post(path=str(tmp_path / "absent")))["path"][0]
    assert "absolute" in _errors(post(path="relative/folder"))["path"][0]
    (tmp_path / "gpt").mkdir()
    (tmp_path / "gpt" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert "not supported" in _errors(post(path=str(tmp_path / "gpt")))["path"][0]
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((checkpoint / name).read_bytes())
    assert "tokenizer.json" in _errors(post(path=str(bare)))["path"][0]
    (bare / "tokenizer.json").write_text("{not a tokenizer")
    assert "does not load" in _errors(post(path=str(bare)))["path"][0]
    assert (
        api.post("/api/models", {"name": "ok", "path": str(checkpoint)}, format="json").status_code
        == 201
    )
    assert (
        "already registered"
        in _errors(api.post("/api/models", {"name": "ok", "path": str(checkpoint)}, format="json"))[
            "name"
        ][0]
    )
    assert "letters, digits" in _errors(post(name="bad name!", path=str(checkpoint)))["name"][0]
    assert RegisteredModel.objects.count() == 1


def test_register_a_dataset_and_its_field_errors(api, tmp_path):
    response = api.post("/api/datasets", {"name": "wp", "path": WORD_PROBLEMS}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["rows"], body["problems"], body["verifier"]) == (400, 400, "numeric")

    def post(**data):
        return api.post(
            "/api/datasets", {"name": "d", "path": WORD_PROBLEMS, **data}, format="json"
        )

    assert "does not exist" in _errors(post(path=str(tmp_path / "none.jsonl")))["path"][0]
    assert "no row has a field 'q'" in _errors(post(prompt_field="q"))["prompt_field"][0]
    assert "fields: answer, question" in _errors(post(answer_field="a"))["answer_field"][0]
    assert "['nope']" in _errors(post(prompt_template="{nope}?"))["prompt_template"][0]
    assert "verifier" in _errors(post(verifier="fuzzy"))
    # answers a verifier cannot read: every row is bad
    assert "0 usable rows of 400" in _errors(post(verifier="choice"))["answer_field"][0]
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{oops\n")
    assert "no row could be read" in _errors(post(path=str(broken)))["path"][0]
    assert "line 1: not valid JSON" in _errors(post(path=str(broken)))["path"][0]
    assert RegisteredDataset.objects.count() == 1


def test_a_run_picks_a_registered_model_and_dataset(api, experiment, checkpoint):
    model = api.post("/api/models", {"name": "q3", "path": str(checkpoint)}, format="json").json()
    api.post("/api/datasets", {"name": "wp", "path": WORD_PROBLEMS}, format="json")
    response = api.post(
        "/api/runs",
        {
            "experiment": experiment.pk,
            "preset": "text-grpo",
            "model": "q3",
            "dataset": "wp",
            "overrides": {"run.steps": 2, "task.eval_size": 8},
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    config = response.json()["config"]
    assert config["model"]["source"] == str(checkpoint)
    assert config["model"]["family"] == "qwen3_moe"
    assert config["model"]["n_layers"] == model["model_fields"]["n_layers"]
    assert config["task"]["name"] == "text" and config["task"]["data_file"] == WORD_PROBLEMS
    assert config["task"]["eval_size"] == 8  # the request's own overrides win
    unknown = api.post("/api/runs", {"experiment": experiment.pk, "model": "nope"}, format="json")
    assert "model" in _errors(unknown)


def test_run_and_compare_pages_show_model_family_params_and_data(user, experiment, checkpoint):
    from lab.assets.services import asset_overrides, register_dataset, register_model

    model = register_model(owner=user, name="q3", path=str(checkpoint))
    dataset = register_dataset(owner=user, name="wp", path=WORD_PROBLEMS)
    imported = submit_run(
        owner=user,
        experiment=experiment,
        preset="text-grpo",
        overrides=asset_overrides(model, dataset),
    )
    builtin = submit_run(owner=user, experiment=experiment, preset="moe-grpo")
    client = Client()
    client.force_login(user)
    page = client.get(f"/runs/{imported.pk}/").content.decode()
    assert "family qwen3_moe" in page
    assert "wp (" in page and "numeric verifier" in page
    total, active = f"{model.total_params / 1e3:.1f}K", f"{model.active_params / 1e3:.1f}K"
    assert f"{total} parameters, {active} active" in page
    other = client.get(f"/runs/{builtin.pk}/").content.decode()
    assert "family builtin" in other and "built-in task arithmetic" in other
    compare = client.get(f"/compare/?runs={imported.pk},{builtin.pk}")
    assert compare.status_code == 200
    text = compare.content.decode()
    assert "qwen3_moe" in text and "builtin" in text
    assert "model.n_layers" in text or "model.family" in text  # the config diff lines them up
    # Qwen3-MoE's dense block 1 logs no expert load: its run page offers layers 0 and 2
    picker = page.split("data-layer-picker")[1].split("</select>")[0]
    assert 'value="0"' in picker and 'value="2"' in picker and 'value="1"' not in picker
    assert Run.objects.count() == 2


def test_the_assets_page_lists_and_registers(user, checkpoint):
    client = Client()
    client.force_login(user)
    assert client.get("/assets/").status_code == 200
    bad = client.post("/assets/", {"kind": "model", "name": "m", "path": "/nowhere"})
    assert bad.status_code == 200 and "path: /nowhere is not a folder" in bad.content.decode()
    ok = client.post("/assets/", {"kind": "model", "name": "m", "path": str(checkpoint)})
    assert ok.status_code == 302
    data = client.post(
        "/assets/", {"kind": "dataset", "name": "wp", "path": "word_problems.jsonl",
                     "prompt_field": "question", "answer_field": "answer", "verifier": "numeric"},
    )  # fmt: skip
    assert data.status_code == 302
    listing = client.get("/assets/").content.decode()
    assert "qwen3_moe" in listing and "word_problems.jsonl" in listing


def test_the_run_form_picks_registered_assets(user, experiment, checkpoint):
    from lab.assets.services import register_dataset, register_model

    register_model(owner=user, name="q3", path=str(checkpoint))
    register_dataset(owner=user, name="wp", path=WORD_PROBLEMS)
    client = Client()
    client.force_login(user)
    page = client.get(f"/experiments/{experiment.pk}/runs/new?preset=text-grpo")
    assert 'name="registered_model"' in page.content.decode()
    config = ExperimentConfig.model_validate({}).to_dict()
    config["rollout"]["max_new_tokens"] = 32  # the longest answer in the checkpoint's tokens
    config["model"]["max_seq_len"] = 256
    config = json.dumps(config)
    response = client.post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "config_json": config, "registered_model": "q3",
         "registered_dataset": "wp", "queue": "cpu", "priority": "0"},
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:2000]
    run = Run.objects.get()
    assert run.config["model"]["family"] == "qwen3_moe"
    assert run.config["task"]["name"] == "text"


def test_openapi_lists_the_registry(api):
    paths = api.get("/api/openapi", HTTP_ACCEPT="application/json").json()["paths"]
    assert {"/api/models", "/api/models/{id}", "/api/datasets", "/api/datasets/{id}"} <= set(paths)


def test_a_finished_run_with_a_checkpoint_offers_the_export(user, experiment, tmp_path):
    run = submit_run(owner=user, experiment=experiment, preset="moe-grpo")
    client = Client()
    client.force_login(user)
    assert (
        "Export as a Hugging Face checkpoint" not in client.get(f"/runs/{run.pk}/").content.decode()
    )  # queued: nothing to export yet
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt").write_bytes(b"")
    Run.objects.filter(pk=run.pk).update(
        status="succeeded", run_dir=str(tmp_path), summary={"steps": 50}
    )
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Export as a Hugging Face checkpoint" in page
    assert f"python -m trainer export {tmp_path} --step 50 --out run-{run.pk:06d}-step50-hf" in page


def test_a_deployment_keeps_registered_paths_on_its_volume(api, checkpoint, settings, tmp_path):
    settings.LAB_ASSET_ROOTS = [tmp_path / "volume"]
    (tmp_path / "volume").mkdir()
    outside = api.post("/api/models", {"name": "q3", "path": str(checkpoint)}, format="json")
    assert "LAB_ASSET_ROOTS" in _errors(outside)["path"][0]
    sneaky = str(tmp_path / "volume" / ".." / checkpoint.name)  # '..' resolves outside too
    assert (
        "LAB_ASSET_ROOTS"
        in _errors(api.post("/api/datasets", {"name": "d", "path": sneaky}, format="json"))["path"][
            0
        ]
    )
    (tmp_path / "volume" / "q3").symlink_to(checkpoint)  # so does a symlink out
    linked = api.post(
        "/api/models", {"name": "q3", "path": str(tmp_path / "volume" / "q3")}, format="json"
    )
    assert "LAB_ASSET_ROOTS" in _errors(linked)["path"][0]
    settings.LAB_ASSET_ROOTS = [checkpoint.parent]
    assert (
        api.post("/api/models", {"name": "q3", "path": str(checkpoint)}, format="json").status_code
        == 201
    )


def test_a_too_short_answer_budget_on_a_registered_model_is_refused_at_submit(
    api, user, experiment, checkpoint
):
    """The word problems' answers take about 20 of the checkpoint's tokens: 8 new
    tokens can never finish one. The form, the API and manage.py submit refuse it at
    rollout.max_new_tokens through the one config gate, before anything is queued
    (it used to pass the form and fail on the worker)."""
    from io import StringIO

    from django.core.management import call_command

    from lab.assets.services import register_dataset, register_model

    register_model(owner=user, name="q3", path=str(checkpoint))
    register_dataset(owner=user, name="wp", path=WORD_PROBLEMS)
    short = {"rollout.max_new_tokens": 8, "run.steps": 2}
    response = api.post(
        "/api/runs",
        {"experiment": experiment.pk, "preset": "text-grpo", "model": "q3", "dataset": "wp",
         "overrides": short},
        format="json",
    )  # fmt: skip
    errors = _errors(response)
    assert "too short" in errors["config.rollout.max_new_tokens"][0]
    client = Client()
    client.force_login(user)
    config = ExperimentConfig.model_validate({}).to_dict()
    config["rollout"]["max_new_tokens"] = 8
    page = client.post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "config_json": json.dumps(config), "registered_model": "q3",
         "registered_dataset": "wp", "queue": "cpu", "priority": "0"},
    )  # fmt: skip
    assert page.status_code == 200 and "too short" in page.content.decode()
    out = StringIO()
    with pytest.raises(SystemExit) as exc:
        call_command(
            "submit", "--user", user.username, "--preset", "text-grpo",
            "--set", f"model.source={checkpoint}",
            "--set", f"task.data_file={WORD_PROBLEMS}", "--set", "rollout.max_new_tokens=8",
            stdout=out, stderr=out,
        )  # fmt: skip
    assert exc.value.code == 2 and "config.rollout.max_new_tokens:" in out.getvalue()
    assert Run.objects.count() == 0


def test_a_tokenizer_that_cannot_write_the_answers_is_refused_at_submit(api, experiment, tmp_path):
    """A checkpoint whose tokenizer has no '#' cannot write GSM8K's '#### 19': every
    response would score 0, so the run is refused at model.source."""
    folder = tmp_path / "no-hash"
    save_hf_checkpoint("qwen3_moe", folder)
    save_char_tokenizer(folder, word_problem_characters().replace("#", ""))
    response = api.post(
        "/api/runs",
        {"experiment": experiment.pk, "preset": "text-grpo",
         "overrides": {"model.source": str(folder), "run.steps": 2,
                       "rollout.max_new_tokens": 64, "model.max_seq_len": 192}},
        format="json",
    )  # fmt: skip
    errors = _errors(response)
    assert "cannot write this task's answers" in errors["config.model.source"][0]
