"""An RL run starts from an imported checkpoint, and ``python -m trainer export``
writes its policy as a checkpoint transformers loads to the same logits."""

from __future__ import annotations

import json

import pytest
import torch
from hf_tiny_checkpoints import save_char_tokenizer, save_hf_checkpoint

from trainer.cli import main as cli_main
from trainer.errors import BAD_INPUT_EXIT_CODE
from trainer.hf import build_model, resolve_model_source
from trainer.model.layers import positions_from_mask
from trainer.run.checkpoint import load_checkpoint
from trainer.validation import validate_config

transformers = pytest.importorskip("transformers")


@pytest.mark.slow
def test_rl_run_from_a_qwen3_moe_checkpoint_then_export(tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))
    src, run_dir, out = tmp_path / "src", tmp_path / "run", tmp_path / "export"
    save_hf_checkpoint("qwen3_moe", src)
    save_char_tokenizer(src)
    overrides = {
        "model": {"source": str(src), "max_seq_len": 64},
        "warm_start": {"enabled": False},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "algorithm": {"minibatches": 1},
        "stabilizers": {"routing_replay": "r3"},
        "run": {"steps": 2, "eval_every": 100, "checkpoint_every": 1},
    }
    config_file = tmp_path / "cfg.json"
    config_file.write_text(json.dumps(overrides))
    assert cli_main(["run", "--config", str(config_file), "--out", str(run_dir)]) == 0
    stored = json.loads((run_dir / "config.json").read_text())
    assert stored["model"]["family"] == "qwen3_moe" and stored["model"]["n_experts"] == 8

    # The run started from the checkpoint's weights, not a random init.
    cfg = resolve_model_source(validate_config(stored)).model
    imported = build_model(cfg, cfg.vocab_size).state_dict()
    policy = load_checkpoint(run_dir)["policy"]
    # (The random checkpoint never answers right, so GRPO's advantages, and the
    # updates, are zero: the policy is still the imported weights.)
    assert policy.keys() == imported.keys()
    for name, value in imported.items():
        torch.testing.assert_close(policy[name], value, rtol=0, atol=1e-3, msg=name)

    assert cli_main(["export", str(run_dir), "--step", "1", "--out", str(out)]) == (
        BAD_INPUT_EXIT_CODE
    )
    assert cli_main(["export", str(run_dir), "--step", "2", "--out", str(out)]) == 0
    assert (out / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    model = build_model(cfg, cfg.vocab_size).eval()
    model.load_state_dict(policy)
    tokens = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad():
        ours = model(tokens, mask).logits
        theirs = hf(input_ids=tokens, position_ids=positions_from_mask(mask)).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_prompt_lengths_are_checked_again_in_the_checkpoint_tokens(tmp_path, capsys):
    src, run_dir = tmp_path / "src", tmp_path / "run"
    save_hf_checkpoint("llama", src)
    save_char_tokenizer(src)
    # A long system preamble: in these tokens prompts no longer fit max_seq_len 64.
    (src / "chat_template.jinja").write_text(
        "{{ 'you are a careful calculator; answer with digits only. ' * 2 }}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    args = ["run", "--preset", "moe-grpo", "--set", f"model.source={src}"]
    args += ["--set", "model.chat_template=true", "--out", str(run_dir)]
    assert cli_main(args) == BAD_INPUT_EXIT_CODE
    assert "model.max_seq_len" in capsys.readouterr().err
    assert not run_dir.exists()
