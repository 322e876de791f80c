"""End to end: bring your own model and data. A tiny random Qwen3-MoE checkpoint
with its own tokenizer, made offline, and the shipped word problems are
registered through the API; a GRPO + R3 run on them goes through the queue (web
server, Celery worker, the real trainer CLI), is exported with
``python -m trainer export``, and transformers loads the export to the logits
of the run's policy. A run on a model whose folder the worker cannot see fails
with that message."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_tiny_checkpoints import save_char_tokenizer, save_hf_checkpoint, word_problem_characters
from lab_processes import LabStack

from trainer.hf import build_model, resolve_model_source
from trainer.model.layers import positions_from_mask
from trainer.run.checkpoint import load_checkpoint
from trainer.tasks.text_data import SHIPPED_DATA
from trainer.validation import validate_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]
transformers = pytest.importorskip("transformers")

RUN_OVERRIDES = {
    "run.steps": 2,
    "run.threads": 1,
    "run.eval_every": 2,
    "run.checkpoint_every": 1,
    "warm_start.max_steps": 2,
    "warm_start.eval_every": 2,
    "warm_start.eval_size": 8,
    "task.eval_size": 8,
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 4,
    "algorithm.minibatches": 1,
    "stabilizers.replay.mode": "r3",
}


@pytest.fixture
def stack(tmp_path):
    stack = LabStack(tmp_path, "filesystem")
    try:
        yield stack
    finally:
        stack.close()


def _error(stack, method: str, path: str, payload: dict) -> dict:
    code, body = stack.request(method, path, payload)
    assert code == 400, (code, body)
    return body["errors"]


def test_registered_checkpoint_and_dataset_train_through_the_queue_and_export(stack, tmp_path):
    src = tmp_path / "qwen3-moe-tiny"
    save_hf_checkpoint("qwen3_moe", src)
    save_char_tokenizer(src, word_problem_characters())
    gone = tmp_path / "moved-away"
    shutil.copytree(src, gone)

    model = stack.post("/api/models", {"name": "qwen3-moe-tiny", "path": str(src)})
    assert model["family"] == "qwen3_moe" and model["active_params"] < model["total_params"]
    data_file = str(SHIPPED_DATA / "word_problems.jsonl")
    dataset = stack.post("/api/datasets", {"name": "word-problems", "path": data_file})
    assert dataset["problems"] == 400
    assert "path" in _error(stack, "POST", "/api/models", {"name": "x", "path": str(tmp_path)})
    stack.post("/api/models", {"name": "moved", "path": str(gone)})

    exp = stack.post("/api/experiments", {"name": "byo model", "preset": "text-grpo"})

    def submit(model_name: str) -> dict:
        return stack.post(
            "/api/runs",
            {"experiment": exp["id"], "preset": "text-grpo", "model": model_name,
             "dataset": "word-problems", "overrides": RUN_OVERRIDES, "queue": stack.queue},
        )  # fmt: skip

    # The checkpoint goes away after submission: the worker cannot see it, and the run
    # fails with the reason. A new submission naming it is refused on the field.
    lost = submit("moved")
    shutil.rmtree(gone)
    refused = _error(
        stack, "POST", "/api/runs",
        {"experiment": exp["id"], "preset": "text-grpo", "model": "moved",
         "dataset": "word-problems", "overrides": RUN_OVERRIDES, "queue": stack.queue},
    )  # fmt: skip
    assert "is not a folder" in refused["config.model.source"][0]
    run = submit("qwen3-moe-tiny")
    assert run["config"]["model"]["family"] == "qwen3_moe"
    assert run["config"]["task"]["data_file"] == data_file
    stack.start_worker("w1")
    failed = stack.wait_status(lost["id"], {"failed", "succeeded"}, timeout=300)
    assert failed["status"] == "failed"
    assert f"model.source: {gone} is not a folder" in failed["error"]
    assert "Traceback" not in failed["error"]

    done = stack.wait_status(run["id"], {"succeeded", "failed"}, timeout=600)
    assert done["status"] == "succeeded", done["error"]
    assert done["summary"]["task_data"]["data_file"]["bad_rows"] == 0
    steps = stack.get(f"/api/runs/{run['id']}/metrics?keys=mismatch/routing_inconsistency")
    assert steps["steps"] == [0, 1]

    # Export the run's last checkpoint and load it with transformers.
    run_dir, out = done["run_dir"], tmp_path / "export"
    export = subprocess.run(
        [sys.executable, "-m", "trainer", "export", run_dir, "--step", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    assert (out / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    cfg = resolve_model_source(validate_config(done["config"])).model
    policy = build_model(cfg, cfg.vocab_size).eval()
    policy.load_state_dict(load_checkpoint(Path(run_dir))["policy"])
    tokens = torch.randint(3, 59, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad():
        ours = policy(tokens, mask).logits
        theirs = hf(input_ids=tokens, position_ids=positions_from_mask(mask)).logits
    assert (ours - theirs).abs().max().item() < 1e-4
