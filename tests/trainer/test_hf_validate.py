"""``validate_checkpoint`` on real safetensors files broken in each way: every
problem is a field error naming the file, found from headers alone, and the
CLI reports it (exit 2, no traceback) before writing anything into --out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hf_tiny_checkpoints import save_char_tokenizer, save_hf_checkpoint

from trainer.cli import main as cli_main
from trainer.errors import BAD_INPUT_EXIT_CODE
from trainer.hf.validate import validate_checkpoint

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """A tiny Qwen3-MoE checkpoint in several shards, with a tokenizer."""
    folder = tmp_path_factory.mktemp("sharded")
    save_hf_checkpoint("qwen3_moe", folder, max_shard_size="100KB")
    save_char_tokenizer(folder)
    return folder


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _messages(folder: Path) -> str:
    errors = validate_checkpoint(folder)
    assert errors and all(field == "model.source" for field, _ in errors)
    return " | ".join(message for _, message in errors)


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("model-*.safetensors"))


def test_a_good_checkpoint_has_no_errors(sharded):
    assert len(_shards(sharded)) > 2
    assert validate_checkpoint(sharded) == []
    assert validate_checkpoint(sharded, field="path", tokenizer=False) == []


def test_a_missing_shard(sharded, tmp_path):
    folder = _copy(sharded, tmp_path / "c")
    gone = _shards(folder)[1]
    gone.unlink()
    assert f"shard {gone.name}" in _messages(folder) and "missing" in _messages(folder)


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda b: b[: len(b) // 2], "truncated"),
        (lambda b: b[:5], "too short"),
        (lambda b: (2**40).to_bytes(8, "little") + b[8:], "does not fit"),
        (lambda b: b[:8] + b"\xff" * 40 + b[48:], "not valid JSON"),
        (lambda b: b[:8] + b[8:].replace(b'"F32"', b'"F99"', 1), "unknown dtype"),
        (lambda b: b[:8] + b[8:].replace(b'"shape":[', b'"shape":[7,', 1), "byte range"),
        (lambda b: b + b"\0" * 16, "16 bytes after the last tensor"),
    ],
)
def test_a_broken_safetensors_file(sharded, tmp_path, damage, said):
    folder = _copy(sharded, tmp_path / "c")
    shard = _shards(folder)[0]
    shard.write_bytes(damage(shard.read_bytes()))
    message = _messages(folder)
    assert shard.name in message and said in message, message


@pytest.mark.parametrize(
    ("ranges", "said"),
    [
        ([(0, 8, "a"), (12, 20, "b")], "leaves a gap at byte 8"),
        ([(0, 8, "a"), (4, 20, "b")], "overlaps"),
        ([(4, 20, "b")], "leaves a gap at byte 0"),
    ],
)
def test_tensors_must_tile_the_data_section(ranges, said):
    from trainer.hf.validate import _check_coverage

    def bad(problem):
        return ValueError(problem)

    with pytest.raises(ValueError, match=said):
        _check_coverage(ranges, 20, bad)
    _check_coverage([(8, 20, "b"), (0, 8, "a")], 20, bad)  # order in the header is free


def test_config_that_disagrees_with_the_weights(tmp_path):
    save_hf_checkpoint("mixtral", tmp_path, num_local_experts=6)
    save_char_tokenizer(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_local_experts": 4}))
    assert "block_sparse_moe.gate.weight" in _messages(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 96}))
    assert "config.json implies" in _messages(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 9}))
    assert "top_k" in _messages(tmp_path)


def test_a_corrupted_tokenizer(sharded, tmp_path):
    folder = _copy(sharded, tmp_path / "c")
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"')
    assert "tokenizer.json does not load" in _messages(folder)
    (folder / "tokenizer.json").unlink()
    assert "no tokenizer.json" in _messages(folder)
    assert validate_checkpoint(folder, tokenizer=False) == []


def test_an_index_naming_a_file_outside_the_folder(sharded, tmp_path):
    folder = _copy(sharded, tmp_path / "c")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "../elsewhere.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "not a file of the folder" in _messages(folder)


def test_validation_does_not_import_torch(sharded):
    code = (
        "import sys; from trainer.hf.validate import validate_checkpoint; "
        f"assert validate_checkpoint({str(sharded)!r}) == []; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("broken", ["missing-shard", "truncated", "tokenizer"])
def test_the_cli_reports_a_bad_checkpoint_and_writes_nothing(sharded, tmp_path, broken, capsys):
    folder = _copy(sharded, tmp_path / "c")
    if broken == "missing-shard":
        _shards(folder)[0].unlink()
    elif broken == "truncated":
        shard = _shards(folder)[-1]
        shard.write_bytes(shard.read_bytes()[:-100])
    else:
        (folder / "tokenizer.json").write_text("{not json")
    out = tmp_path / "run"
    code = cli_main(
        ["run", "--preset", "text-grpo", "--set", f"model.source={folder}", "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert code == BAD_INPUT_EXIT_CODE, err
    assert "model.source" in err and "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())
