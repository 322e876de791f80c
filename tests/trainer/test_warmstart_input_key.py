"""The warm-start cache is keyed by what the input files hold: a data file or a
checkpoint rewritten at the same path gives another key (a new base is
trained, and a broken file is then refused by the checks), the same content
the same key."""

from __future__ import annotations

import json

import torch
from hf_tiny_checkpoints import save_hf_checkpoint

from trainer.config import ExperimentConfig
from trainer.hf.files import content_fingerprint
from trainer.run.warmstart import warm_start_key

CPU = torch.device("cpu")


def _rows(tmp_path, answer: int):
    file = tmp_path / "data.jsonl"
    rows = [{"question": f"q{i}", "answer": f"#### {answer + i}"} for i in range(4)]
    file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return file


def test_a_data_file_edited_in_place_changes_the_key(tmp_path):
    file = _rows(tmp_path, 1)
    cfg = ExperimentConfig.model_validate({"task": {"name": "text", "data_file": str(file)}})
    first = warm_start_key(cfg, 259, CPU)
    assert warm_start_key(cfg, 259, CPU) == first
    _rows(tmp_path, 2)
    assert warm_start_key(cfg, 259, CPU) != first


def test_a_checkpoint_rewritten_in_place_changes_the_fingerprint(tmp_path):
    save_hf_checkpoint("qwen3", tmp_path, seed=0)
    first = content_fingerprint([tmp_path])
    assert content_fingerprint([tmp_path]) == first
    save_hf_checkpoint("qwen3", tmp_path, seed=1)
    assert content_fingerprint([tmp_path]) != first
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])  # truncated in place
    assert content_fingerprint([tmp_path]) not in (first,)
