"""A run checks the weights it is given before it trusts them: a NaN or Inf in a
checkpoint tensor, or a weight stored as an integer, is a field error naming the
tensor before the run trains (exit 2, nothing written into --out); a loss that is
not finite at the first step fails the run with that reason, not a collapse."""

from __future__ import annotations

import json

import pytest
from hf_tiny_checkpoints import poisoned, retyped, save_char_tokenizer, save_hf_checkpoint

from trainer.cli import main as cli_main
from trainer.errors import BAD_INPUT_EXIT_CODE

pytestmark = pytest.mark.slow  # a transformers checkpoint and a trainer run

NORM = "model.norm.weight"


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    save_hf_checkpoint("llama", folder)
    save_char_tokenizer(folder)
    return folder


def _run(src, out, capsys) -> tuple[int, str]:
    args = ["run", "--preset", "moe-grpo", "--set", f"model.source={src}"]
    args += ["--set", "model.max_seq_len=64", "--set", "warm_start.enabled=false"]
    args += ["--set", "run.steps=2", "--set", "rollout.prompts_per_step=2"]
    args += ["--set", "rollout.group_size=2", "--set", "algorithm.minibatches=1", "--out", str(out)]
    code = cli_main(args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_weight_stops_the_run_before_it_trains(
    clean, tmp_path, capsys, value, monkeypatch
):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))
    src = poisoned(clean, tmp_path / "bad", NORM, value)
    code, err = _run(src, tmp_path / "run", capsys)
    assert code == BAD_INPUT_EXIT_CODE, err
    assert "model.source" in err and NORM in err and "NaN or infinite" in err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_integer_weight_stops_the_run_before_anything_is_written(clean, tmp_path, capsys):
    src = retyped(clean, tmp_path / "int", NORM)
    code, err = _run(src, tmp_path / "run", capsys)
    assert code == BAD_INPUT_EXIT_CODE and NORM in err and "I32" in err
    assert not (tmp_path / "run").exists()


def test_a_loss_not_finite_at_the_first_step_fails_the_run_not_a_collapse(
    clean, tmp_path, capsys, monkeypatch
):
    """Finite weights so large that the first forward overflows (3e38 in the final
    norm): the loss is NaN at step 0. The run fails with that reason."""
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))
    src = poisoned(clean, tmp_path / "huge", NORM, 3e38, index=None)
    out = tmp_path / "run"
    code, err = _run(src, out, capsys)
    assert code == BAD_INPUT_EXIT_CODE, err
    assert "not finite at the first step" in err and "did not collapse" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and not summary["collapsed"]
    assert "not finite at the first step" in summary["error"]
