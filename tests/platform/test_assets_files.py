"""Files are checked before they are trusted: real safetensors files written by
``safetensors.torch.save_file`` (through transformers' ``save_pretrained``)
and then broken in each way, configs that disagree with their weights, and
non-UTF-8 data, at registration and at run submission (API, form, assets
page). Each is a 400 naming the field and the file, never a 500, and
nothing is stored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.test import Client
from hf_tiny_checkpoints import save_char_tokenizer, save_hf_checkpoint, word_problem_characters
from safetensors.torch import load_file, save_file

from lab.assets.models import RegisteredDataset, RegisteredModel
from lab.assets.text_files import first_undecodable_line
from lab.experiments.models import Experiment
from lab.runs.models import Run


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qwen3moe")
    save_hf_checkpoint("qwen3_moe", folder)  # 8 experts, hidden 64, top-2
    save_char_tokenizer(folder, word_problem_characters())
    return folder


@pytest.fixture
def copy(checkpoint, tmp_path):
    def make(name: str = "ckpt") -> Path:
        target = tmp_path / name
        shutil.copytree(checkpoint, target)
        return target

    return make


def _config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))


def _register(api, folder: Path) -> dict[str, list[str]]:
    api.raise_request_exception = False  # a 500 must show as a status code, not an exception
    response = api.post("/api/models", {"name": "m", "path": str(folder)}, format="json")
    assert response.status_code == 400, response.content[:500]
    assert RegisteredModel.objects.count() == 0
    return response.json()["errors"]


def test_hidden_size_that_disagrees_with_the_weights_names_the_tensor(api, copy):
    folder = copy()
    _config(folder, hidden_size=32)
    message = _register(api, folder)["path"][0]
    assert "'model.embed_tokens.weight' has shape [96, 64]" in message
    assert "config.json implies [96, 32]" in message


def test_top_k_above_the_expert_count_is_a_field_error(api, copy):
    folder = copy()
    _config(folder, num_experts_per_tok=9)
    assert "top_k (9) cannot exceed n_experts (8)" in _register(api, folder)["path"][0]


def test_fewer_experts_in_config_than_in_the_weights(api, copy):
    folder = copy()
    _config(folder, num_experts=4)  # the weights hold 8
    message = _register(api, folder)["path"][0]
    assert "mlp.gate.weight' has shape [8, 64] but config.json implies [4, 64]" in message


def test_more_experts_in_config_than_in_the_weights(api, copy):
    folder = copy()
    _config(folder, num_experts=12)
    assert "has shape [8, 64] but config.json implies [12, 64]" in _register(api, folder)["path"][0]


def _shard(folder: Path) -> list[str]:
    """Rewrite the checkpoint as two shards with an index (as save_pretrained does
    above its shard size)."""
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    halves = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for file, half in zip(files, halves, strict=True):
        save_file({n: tensors[n] for n in half}, str(folder / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(half, file)
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return files


def test_a_sharded_checkpoint_registers_and_a_missing_shard_is_named(api, copy):
    folder = copy()
    files = _shard(folder)
    ok = api.post("/api/models", {"name": "sharded", "path": str(folder)}, format="json")
    assert ok.status_code == 201, ok.content
    RegisteredModel.objects.all().delete()
    (folder / files[1]).unlink()
    assert f"shard {files[1]} named in" in _register(api, folder)["path"][0]


def _break(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) - 100])
    elif how == "header_corrupted":  # the JSON header's first bytes overwritten
        path.write_bytes(data[:8] + b"\xff\xfe garbage" + data[18:])
    elif how == "header_length_huge":
        path.write_bytes((2**60).to_bytes(8, "little") + data[8:])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "not_safetensors":
        path.write_bytes(b"PK\x03\x04 a zip file, not safetensors" * 10)


@pytest.mark.parametrize(
    "how",
    ["truncated", "header_corrupted", "header_length_huge", "empty", "not_safetensors"],
)
def test_a_broken_safetensors_file_is_a_field_error_naming_it(api, copy, how):
    folder = copy()
    _break(folder / "model.safetensors", how)
    message = _register(api, folder)["path"][0]
    assert message.startswith("model.safetensors: "), message


def test_a_broken_shard_is_named(api, copy):
    folder = copy()
    files = _shard(folder)
    _break(folder / files[0], "truncated")
    assert _register(api, folder)["path"][0].startswith(f"{files[0]}: ")


def test_a_corrupted_tokenizer_and_a_non_utf8_config_are_field_errors(api, copy):
    folder = copy()
    (folder / "tokenizer.json").write_bytes(b'{"version": "1.0", "model": \xff')
    assert "tokenizer" in _register(api, folder)["path"][0]
    folder = copy("other")
    (folder / "config.json").write_bytes(b'{"model_type": "qwen3_moe\xff"}')
    assert "config.json" in _register(api, folder)["path"][0]


# ----------------------------------------------------------------- non-UTF-8 data

NON_UTF8 = (
    b'{"question": "What is 1 + 1?", "answer": "#### 2"}\n'
    b'{"question": "What is 2 + 2?", "answer": "#### 4"}\n'
    b'{"question": "What is 3 + 3\xff?", "answer": "#### 6"}\n'
)


@pytest.fixture
def latin1_file(tmp_path) -> Path:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(NON_UTF8)
    return path


def test_first_undecodable_line_counts_lines_across_chunks(tmp_path, monkeypatch):
    from lab.assets import text_files

    monkeypatch.setattr(text_files, "CHUNK_BYTES", 7)  # lines span several chunks
    path = tmp_path / "f.jsonl"
    path.write_bytes(NON_UTF8)
    assert first_undecodable_line(path) == 3
    path.write_bytes(b"ok\n" * 5 + "é".encode())  # a character split over two chunks is fine
    assert first_undecodable_line(path) is None


def test_a_non_utf8_line_is_skipped_and_counted_at_registration(api, latin1_file):
    response = api.post("/api/datasets", {"name": "d", "path": str(latin1_file)}, format="json")
    assert response.status_code == 201, response.content[:300]
    body = response.json()
    assert (body["rows"], body["problems"]) == (3, 2)
    assert body["skipped"] == {"not UTF-8 text": {"count": 1, "lines": [3]}}
    assert RegisteredDataset.objects.get().skipped == body["skipped"]


@pytest.fixture
def unreadable_file(tmp_path) -> Path:
    path = tmp_path / "unreadable.jsonl"
    path.write_bytes(b'{"question": "\xff", "answer": "#### 1"}\n' * 3)
    return path


def test_a_file_with_no_readable_line_is_a_400_everywhere(api, experiment, unreadable_file):
    api.raise_request_exception = False
    registered = api.post(
        "/api/datasets", {"name": "d", "path": str(unreadable_file)}, format="json"
    )
    assert registered.status_code == 400, registered.content[:300]
    assert "no row could be read" in registered.json()["errors"]["path"][0]
    assert "line 1: not UTF-8" in registered.json()["errors"]["path"][0]
    task = {"task": {"name": "text", "data_file": str(unreadable_file)}}
    run = api.post(
        "/api/runs",
        {"experiment": experiment.pk, "preset": "moe-grpo", "overrides": task},
        format="json",
    )
    assert run.status_code == 400, run.content[:300]
    assert "not UTF-8" in run.json()["errors"]["config.task.data_file"][0]
    made = api.post(
        "/api/experiments", {"name": "x", "preset": "moe-grpo", "overrides": task}, format="json"
    )
    assert made.status_code == 400, made.content[:300]
    assert "not UTF-8" in made.json()["errors"]["config.task.data_file"][0]
    assert Run.objects.count() == 0 and Experiment.objects.count() == 1
    assert RegisteredDataset.objects.count() == 0


def test_a_run_on_a_file_with_a_non_utf8_line_is_accepted(api, experiment, latin1_file):
    task = {"task": {"name": "text", "data_file": str(latin1_file)}}
    run = api.post(
        "/api/runs",
        {"experiment": experiment.pk, "preset": "moe-grpo", "overrides": task},
        format="json",
    )
    assert run.status_code == 201, run.content[:300]
    assert run.json()["config"]["task"]["data_file"] == str(latin1_file)


def test_an_unreadable_file_is_an_inline_error_in_the_forms(user, experiment, unreadable_file):
    client = Client(raise_request_exception=False)
    client.force_login(user)
    config = {"task": {"name": "text", "data_file": str(unreadable_file)}, "run": {"steps": 2}}
    page = client.post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "config_json": json.dumps(config), "queue": "cpu", "priority": "0"},
    )
    assert page.status_code == 200 and "not UTF-8" in page.content.decode()
    assets = client.post(
        "/assets/",
        {"kind": "dataset", "name": "d", "path": str(unreadable_file), "verifier": "numeric"},
    )
    assert assets.status_code == 200 and "no row could be read" in assets.content.decode()
    assert Run.objects.count() == 0 and RegisteredDataset.objects.count() == 0


def test_the_assets_page_shows_skipped_lines(user, api, latin1_file):
    api.post("/api/datasets", {"name": "d", "path": str(latin1_file)}, format="json")
    client = Client()
    client.force_login(user)
    page = client.get("/assets/").content.decode()
    assert "1 skipped: not UTF-8 text (line 3)" in page


# ----------------------------------------------------------------- submission


def test_a_run_naming_a_broken_checkpoint_is_refused_at_submission(api, experiment, copy):
    api.raise_request_exception = False
    folder = copy()
    _break(folder / "model.safetensors", "truncated")
    response = api.post(
        "/api/runs",
        {
            "experiment": experiment.pk,
            "preset": "text-grpo",
            "overrides": {"model.source": str(folder)},
        },
        format="json",
    )
    assert response.status_code == 400, response.content[:300]
    assert response.json()["errors"]["config.model.source"][0].startswith("model.safetensors: ")
    assert Run.objects.count() == 0


def test_a_checkpoint_replaced_after_registration_is_checked_again(api, experiment, copy):
    folder = copy()
    assert (
        api.post("/api/models", {"name": "q3", "path": str(folder)}, format="json").status_code
        == 201
    )
    body = {"experiment": experiment.pk, "preset": "text-grpo", "model": "q3"}
    body["overrides"] = {"run.steps": 2}
    assert api.post("/api/runs", body, format="json").status_code == 201
    _break(folder / "model.safetensors", "truncated")
    api.raise_request_exception = False
    refused = api.post("/api/runs", body, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"]["config.model.source"][0].startswith("model.safetensors: ")
    assert Run.objects.count() == 1


# ----------------------------------------------------------------- large datasets


@pytest.fixture
def big_file(tmp_path, settings) -> Path:
    """A dataset file over the inline limit (lowered to 100 bytes for the test)."""
    settings.LAB_DATASET_INLINE_BYTES = 100
    path = tmp_path / "big.jsonl"
    rows = [{"question": f"Ana has {i} apples and gets 1 more.", "answer": f"#### {i + 1}"}
            for i in range(20)]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    return path


def test_a_large_dataset_is_checked_by_the_control_worker_not_the_request(
    api, user, experiment, big_file, monkeypatch, django_capture_on_commit_callbacks
):
    from lab.assets.services import check_dataset

    sent = []
    monkeypatch.setattr(
        "lab.site.celery.app.send_task", lambda name, args, **kw: sent.append((name, args, kw))
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/datasets", {"name": "big", "path": str(big_file)}, format="json")
    assert response.status_code == 201, response.content[:300]
    body = response.json()
    assert (body["status"], body["rows"], body["problems"]) == ("checking", 0, 0)
    assert sent == [("assets.check_dataset", [body["id"]], {"queue": "control", "retry": False})]
    client = Client()
    client.force_login(user)
    assert "checking</span>" in client.get("/assets/").content.decode()
    # Until the check is done no run picks it, on the API or in the form.
    api.raise_request_exception = False
    refused = api.post(
        "/api/runs", {"experiment": experiment.pk, "preset": "moe-grpo", "dataset": "big"},
        format="json",
    )  # fmt: skip
    assert refused.status_code == 400, refused.content[:300]
    assert "still being checked" in refused.json()["errors"]["dataset"][0]
    # The worker's side: checked once, a repeated delivery does nothing.
    assert check_dataset(body["id"]) == "ready" and check_dataset(body["id"]) == "skipped"
    dataset = RegisteredDataset.objects.get()
    assert (dataset.status, dataset.rows, dataset.problems) == ("ready", 21, 20)
    assert "not valid JSON" in " ".join(dataset.skipped)
    accepted = api.post(
        "/api/runs", {"experiment": experiment.pk, "preset": "moe-grpo", "dataset": "big"},
        format="json",
    )  # fmt: skip
    assert accepted.status_code == 201, accepted.content[:300]
    assert accepted.json()["config"]["task"]["data_file"] == str(big_file)


def test_a_large_dataset_that_fails_its_check_says_why_and_is_never_picked(
    api, experiment, big_file, monkeypatch, django_capture_on_commit_callbacks
):
    from lab.assets.services import check_dataset

    monkeypatch.setattr("lab.site.celery.app.send_task", lambda *a, **kw: None)
    with django_capture_on_commit_callbacks(execute=True):
        body = api.post(
            "/api/datasets", {"name": "big", "path": str(big_file), "answer_field": "nope"},
            format="json",
        ).json()  # fmt: skip
    assert check_dataset(body["id"]) == "failed"
    failed = api.get(f"/api/datasets/{body['id']}").json()
    assert failed["status"] == "failed" and "no row has a field 'nope'" in failed["error"]
    api.raise_request_exception = False
    refused = api.post(
        "/api/runs", {"experiment": experiment.pk, "preset": "moe-grpo", "dataset": "big"},
        format="json",
    )  # fmt: skip
    assert (
        refused.status_code == 400 and "failed its check" in refused.json()["errors"]["dataset"][0]
    )


def test_a_broker_that_refuses_the_check_fails_the_dataset_with_the_reason(
    api, big_file, monkeypatch, django_capture_on_commit_callbacks
):
    def refuse(*args, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr("lab.site.celery.app.send_task", refuse)
    with django_capture_on_commit_callbacks(execute=True):
        api.post("/api/datasets", {"name": "big", "path": str(big_file)}, format="json")
    dataset = RegisteredDataset.objects.get()
    assert dataset.status == "failed" and "broker down" in dataset.error


def test_one_submission_reports_every_kind_of_error_at_once(api, experiment, copy):
    """A wrong type, a rule across two fields, a task length and the checkpoint's
    broken tokenizer: four errors from one request, where each used to wait for the
    one before it to be fixed (trainer.validation.all_errors, lab.configs)."""
    api.raise_request_exception = False
    folder = copy()
    (folder / "tokenizer.json").write_bytes(b'{"version": "1.0", "model": \xff')
    response = api.post(
        "/api/runs",
        {
            "experiment": experiment.pk,
            "preset": "text-grpo",
            "overrides": {
                "model.source": str(folder),
                "run.steps": "abc",
                "run.gpus": 4,
                "rollout.prompts_per_step": 2,
            },
        },
        format="json",
    )
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert "valid integer" in errors["config.run.steps"][0]
    assert "4 ranks" in errors["config.rollout.prompts_per_step"][0]
    assert "tokenizer" in errors["config.model.source"][0]
    assert Run.objects.count() == 0
