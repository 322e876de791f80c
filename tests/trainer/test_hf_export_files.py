"""What an export writes and refuses: the folder appears whole (written next to
it, renamed into place), a non-empty target is replaced only with --replace
(no shard of an earlier export survives), an imported model's export refuses
when its source checkpoint is gone, the export needs neither the run's data
nor its reward module, and a builtin model's export carries tokenizer files
that encode text to the ids the model was trained on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_tiny_checkpoints import save_hf_checkpoint

from trainer.cli import main as cli_main
from trainer.config import ExperimentConfig
from trainer.errors import BAD_INPUT_EXIT_CODE, FieldError
from trainer.hf import build_model, export_hf, resolve_model_source
from trainer.hf import export as export_module
from trainer.model.layers import positions_from_mask
from trainer.run.checkpoint import save_checkpoint
from trainer.run.export import export_run
from trainer.tasks.byte_tokenizer import ByteTokenizer
from trainer.tasks.tokenizer import CharTokenizer

transformers = pytest.importorskip("transformers")
TINY = {"n_layers": 2, "d_model": 32, "n_heads": 4, "expert_hidden": 32}


def _run_dir(tmp_path: Path, task: dict, vocab: int) -> tuple[Path, torch.nn.Module]:
    """A run folder with a stored config and a step-3 checkpoint of a builtin model."""
    cfg = ExperimentConfig.model_validate({"model": TINY, "task": task})
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab).eval()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    save_checkpoint(run, {"run_state": {"step": 3}, "policy": model.state_dict()})
    return run, model


def _logit_diff(folder: Path, model: torch.nn.Module, vocab: int) -> float:
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokens = torch.randint(0, vocab, (1, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad():
        ours = model(tokens, mask).logits
        theirs = hf(input_ids=tokens, position_ids=positions_from_mask(mask)).logits
    return (ours - theirs).abs().max().item()


def test_a_text_run_exports_without_its_reward_module_with_byte_tokenizer_files(tmp_path):
    task = {"name": "text", "verifier": "python", "reward_function": "no_such_module_x:score"}
    vocab = ByteTokenizer().vocab_size
    run, model = _run_dir(tmp_path, task, vocab)
    out = tmp_path / "export"
    assert cli_main(["export", str(run), "--step", "3", "--out", str(out)]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "Ana has 12 apples, ü?"
    assert tok(text)["input_ids"] == ByteTokenizer().encode(text)
    assert tok.decode(ByteTokenizer().encode(text), skip_special_tokens=True) == text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    assert _logit_diff(out, model, vocab) < 1e-4


def test_a_task_run_exports_the_character_tokenizer(tmp_path):
    run, _ = _run_dir(tmp_path, {"name": "arithmetic"}, CharTokenizer().vocab_size)
    out = tmp_path / "export"
    assert cli_main(["export", str(run), "--step", "3", "--out", str(out)]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok("37+58=")["input_ids"] == CharTokenizer().encode("37+58=")


def test_a_non_empty_target_is_refused_then_replaced_whole(tmp_path, capsys):
    vocab = CharTokenizer().vocab_size
    run, model = _run_dir(tmp_path, {"name": "arithmetic"}, vocab)
    out = tmp_path / "export"
    # An earlier export of other weights, sharded.
    torch.manual_seed(9)
    other = build_model(model.cfg, vocab)
    export_hf(other.state_dict(), model.cfg, vocab, out, max_shard_bytes=20_000)
    earlier = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in earlier
    assert cli_main(["export", str(run), "--step", "3", "--out", str(out)]) == BAD_INPUT_EXIT_CODE
    assert "--replace" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == earlier  # untouched
    assert cli_main(["export", str(run), "--step", "3", "--out", str(out), "--replace"]) == 0
    names = {p.name for p in out.iterdir()}
    assert "model.safetensors" in names and not any(n.startswith("model-0") for n in names)
    assert "model.safetensors.index.json" not in names
    assert _logit_diff(out, model, vocab) < 1e-4
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_failed_export_leaves_no_folder(tmp_path, monkeypatch):
    run, _ = _run_dir(tmp_path, {"name": "arithmetic"}, CharTokenizer().vocab_size)

    def disk_full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module, "_write_weights", disk_full)
    with pytest.raises(OSError):
        export_run(run, 3, tmp_path / "export")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_an_export_whose_source_checkpoint_is_gone_is_refused(tmp_path):
    src = tmp_path / "src"
    save_hf_checkpoint("qwen3", src)
    cfg = resolve_model_source(
        ExperimentConfig.model_validate({"model": {"source": str(src), "max_seq_len": 64}})
    ).model
    state = build_model(cfg, cfg.vocab_size).state_dict()
    src.rename(tmp_path / "moved")
    with pytest.raises(FieldError) as exc:
        export_hf(state, cfg, cfg.vocab_size, tmp_path / "export")
    assert "is gone" in exc.value.as_dict()["model.source"][0]
    assert not (tmp_path / "export").exists()


def test_export_refuses_the_run_folder_and_folders_holding_it(tmp_path, capsys):
    """`--out RUN_DIR --replace` once deleted the run it was exporting."""
    run, _ = _run_dir(tmp_path, {"name": "arithmetic"}, CharTokenizer().vocab_size)
    before = sorted(p.name for p in run.iterdir())
    for out in (run, run.parent, run / ".."):
        code = cli_main(["export", str(run), "--step", "3", "--out", str(out), "--replace"])
        err = capsys.readouterr().err
        assert code == BAD_INPUT_EXIT_CODE and "--out" in err and "holds the run folder" in err
        assert "Traceback" not in err
    assert sorted(p.name for p in run.iterdir()) == before  # nothing removed
    # Another run's folder is not a place to export into either.
    other = tmp_path / "other-run"
    other.mkdir()
    for name in ("config.json", "metrics.jsonl"):
        (other / name).write_text("{}")
    assert cli_main(["export", str(run), "--step", "3", "--out", str(other), "--replace"]) == (
        BAD_INPUT_EXIT_CODE
    )
    assert "is a run folder" in capsys.readouterr().err and (other / "metrics.jsonl").exists()
    # Inside the run folder (where the platform writes exports) is fine.
    assert cli_main(["export", str(run), "--step", "3", "--out", str(run / "exports" / "s3")]) == 0


def test_an_unwritable_out_is_a_message_not_a_traceback(tmp_path, capsys):
    run, _ = _run_dir(tmp_path, {"name": "arithmetic"}, CharTokenizer().vocab_size)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    # (file permissions do not stop root, which runs these tests: a file in the way,
    # and a place no one can create folders in)
    for out in (a_file / "export", Path("/proc/no-such/export")):
        code = cli_main(["export", str(run), "--step", "3", "--out", str(out)])
        err = capsys.readouterr().err
        assert code == BAD_INPUT_EXIT_CODE and "Traceback" not in err, err
        assert "--out: cannot write into" in err
