"""Text tasks: verifiers against hand-computed answers, file reading, bad rows,
held-out split, lengths, the shipped word problems and the text preset."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config import ExperimentConfig, TextTaskConfig
from trainer.config.presets import resolve_preset
from trainer.errors import FieldError
from trainer.tasks import TextTask, check_lengths, make_task
from trainer.tasks.byte_tokenizer import ByteTokenizer
from trainer.tasks.verifiers import (
    BadRow,
    ChoiceVerifier,
    ExactVerifier,
    NumericVerifier,
    final_answer,
    last_boxed,
    parse_number,
)
from trainer.validation import validate_config

REPO = Path(__file__).resolve().parents[2]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def text_task(path: Path, **kwargs) -> TextTask:
    task = make_task(TextTaskConfig(data_file=str(path), **kwargs))
    assert isinstance(task, TextTask)
    return task


# --------------------------------------------------------------------------- extraction
def test_final_answer_reads_gsm8k_marker_then_boxed():
    assert final_answer("3 + 4 = 7\n#### 7") == "7"
    assert final_answer("#### 1 #### 2") == "2"  # the last marker
    assert final_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{a{b}c} and \\boxed{x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed{unclosed") is None
    assert final_answer("no marker here") is None
    assert final_answer("no marker", whole_text_fallback=True) == "no marker"
    assert final_answer("####   ") is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42.0),
        ("-3", -3.0),
        ("1,234", 1234.0),
        ("$5.50", 5.5),
        ("50%", 50.0),
        ("3/4", 0.75),
        ("\\frac{3}{4}", 0.75),
        ("\\dfrac{1}{8}", 0.125),
        ("7.", 7.0),
        ("1e3", 1000.0),
        ("seven", None),
        ("1/0", None),
        ("", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


# --------------------------------------------------------------------------- verifiers
def test_numeric_verifier_with_tolerance():
    strict = NumericVerifier(1e-6)
    gold = strict.gold("12 * 3 = 36\n#### 36")
    assert gold == "36"
    assert strict.reward("#### 36", gold, 0.1) == 1.0
    assert strict.reward("so \\boxed{36.0}", gold, 0.1) == 1.0
    assert strict.reward("#### 1,036", gold, 0.1) == 0.1  # parses, wrong: format reward
    assert strict.reward("36", gold, 0.1) == 0.0  # no marker: no final answer
    assert strict.reward("#### thirty-six", gold, 0.1) == 0.1  # marked but not a number
    assert strict.reward("#### 36 apples", gold, 0.1) == 1.0  # the leading number
    assert strict.reward("#### apples 36", gold, 0.1) == 0.1
    # tolerance is relative to max(1, |gold|): 1% of 36 is 0.36
    loose = NumericVerifier(0.01)
    assert loose.is_correct("#### 36.3", "36")
    assert not loose.is_correct("#### 36.4", "36")
    # below 1 the tolerance is absolute: |0.5 - 0.509| = 0.009 <= 0.01
    assert loose.is_correct("#### 0.509", "1/2")
    assert strict.gold(7) == "7" and strict.gold(7.0) == "7" and strict.gold(2.5) == "2.5"
    with pytest.raises(BadRow, match="not a number"):
        strict.gold("#### many")
    with pytest.raises(BadRow, match="missing"):
        strict.gold(None)


def test_exact_verifier_strips_whitespace_only():
    v = ExactVerifier()
    gold = v.gold("Paris")
    assert v.is_correct("  Paris\n", gold)
    assert v.is_correct("The capital.\n#### Paris", gold)
    assert not v.is_correct("paris", gold)
    assert v.reward("London", gold, 0.2) == 0.2


def test_choice_verifier_reads_the_last_label():
    v = ChoiceVerifier("ABCD")
    assert v.gold("(c)") == "C"
    assert v.gold(1) == "B"
    with pytest.raises(BadRow):
        v.gold(4)
    with pytest.raises(BadRow):
        v.gold("E")
    assert v.is_correct("I think (A) but finally C", "C")
    assert v.is_correct("Answer: B", "B")
    assert not v.is_correct("Because...", "B")  # 'B' inside a word is not a label
    assert v.reward("no label at all", "B", 0.1) == 0.0
    assert v.reward("#### D", "B", 0.1) == 0.1


def test_python_verifier_bad_path_is_a_field_error(tmp_path):
    # Building the task imports nothing (the function runs in its own process,
    # tests/trainer/test_reward_process.py); starting it names the field.
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a"}] * 3)
    task = text_task(path, verifier="python", reward_function="no_such_module_xyz:f")
    with pytest.raises(FieldError) as info:
        task.start()
    assert info.value.errors[0][0] == "task.reward_function"
    errors = _field_errors({"task": {"name": "text", "verifier": "python"}})
    assert errors[0][0] == "task.reward_function"


def _field_errors(data: dict) -> list[tuple[str, str]]:
    with pytest.raises(FieldError) as info:
        validate_config(data)
    return info.value.errors


# --------------------------------------------------------------------------- files, bad rows
def test_bad_rows_are_counted_by_reason_never_a_crash(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(20)]
    rows += [
        {"question": "no answer"},
        {"question": "bad answer", "answer": "#### lots"},
        {"answer": "#### 3"},
        {"question": "   ", "answer": "#### 3"},
    ]
    task = text_task(write_jsonl(tmp_path / "d.jsonl", rows))
    report = task.data_report()["data_file"]
    assert report["rows"] == 24 and report["problems"] == 20 and report["bad_rows"] == 4
    assert report["bad_row_reasons"] == {
        "answer field 'answer' is missing": 1,
        "answer is not a number": 1,
        "prompt field 'question' is missing": 1,
        "prompt is empty": 1,
    }


def test_prompt_template_and_parquet(tmp_path):
    import datasets

    rows = [{"q": f"{i}+{i}", "a": 2 * i, "ctx": "sum"} for i in range(30)]
    path = tmp_path / "d.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    task = text_task(path, prompt_template="{ctx}: {q}=", answer_field="a")
    problem = task.build(3)
    assert problem.prompt == "sum: 3+3="
    assert problem.answer == "6"
    assert problem.target == "#### 6"  # an unmarked number is supervised in GSM8K form
    assert task.reward(problem, "#### 6") == 1.0
    missing = text_task(path, prompt_template="{nope} {q}", answer_field="a")
    with pytest.raises(FieldError, match=r"0 usable rows of 30.*'nope' is missing"):
        missing.space_size()


def test_missing_or_malformed_file_is_a_field_error(tmp_path):
    with pytest.raises(FieldError) as info:
        text_task(tmp_path / "absent.jsonl").space_size()
    assert info.value.errors[0][0] == "task.data_file"
    assert "does not exist" in info.value.errors[0][1]
    with pytest.raises(FieldError, match="neither an absolute path nor a file shipped"):
        make_task(TextTaskConfig(data_file="relative/file.jsonl")).space_size()
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "a", "answer": "#### 1"}\n{not json\n')
    # one good row left after the malformed line is skipped: too few, named by line
    with pytest.raises(FieldError, match=r"not valid JSON .*\(line 2\)"):
        text_task(broken).space_size()
    csv = tmp_path / "d.csv"
    csv.write_text("question,answer\n")
    with pytest.raises(FieldError, match=r"use a \.jsonl"):
        text_task(csv).space_size()
    errors = _field_errors(
        resolve_preset("text-grpo").to_dict() | {"task": {"name": "text", "data_file": str(csv)}}
    )
    assert errors[0][0] == "task.data_file"


# --------------------------------------------------------------------------- split, sampling
def test_held_out_split_is_disjoint_and_eval_file_replaces_it(tmp_path):
    rows = [{"question": f"what is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(100)]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    task = text_task(path, eval_size=8)
    held = {p.prompt for p in task.eval_set()}
    assert len(held) == 8  # 10 of 100 held out, 8 asked for
    trained = {p.prompt for p in task.sample(500, random.Random(0))}
    assert not held & trained
    assert task.eval_set() == task.eval_set()
    test = write_jsonl(tmp_path / "test.jsonl", rows[:12])
    with_file = text_task(path, eval_file=str(test), eval_size=8)
    assert {p.prompt for p in with_file.eval_set()} <= {r["question"] for r in rows[:12]}
    assert len(with_file.eval_set()) == 8
    # every training row trains when the evaluation set is a separate file
    assert len({p.prompt for p in with_file.sample(2000, random.Random(0))}) == 100
    assert with_file.data_report()["eval_file"]["problems"] == 12


# --------------------------------------------------------------------------- tokens, lengths
def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    ids = tok.encode("Hi é", eos=True)
    assert ids == [1, 75, 108, 35, 198, 172, 2]  # 'H'=72, 'i'=105, ' '=32, 'é'=0xC3 0xA9
    assert tok.decode([*ids, 0, 0]) == "Hi é"
    assert tok.decode([200]) == "\ufffd"  # a lone continuation byte


def test_shipped_word_problems_preset_and_lengths():
    cfg = resolve_preset("text-grpo")
    task = make_task(cfg.task)
    report = task.data_report()["data_file"]
    assert report == {
        "rows": 400,
        "problems": 400,
        "bad_rows": 0,
        "bad_row_reasons": {},
        "bad_row_lines": {},
    }
    # every shipped target is its own correct answer
    assert all(task.is_correct(p, p.target) for p in task.train_table.problems)
    assert task.max_target_len <= cfg.rollout.max_new_tokens
    assert check_lengths(cfg) == []
    too_short = cfg.model_copy(
        update={"rollout": cfg.rollout.model_copy(update={"max_new_tokens": 8})}
    )
    assert [path for path, _ in check_lengths(too_short)] == ["rollout.max_new_tokens"]
    # On an imported model, bytes overcount tokens: checked after its tokenizer is installed.
    imported = too_short.model_copy(
        update={"model": cfg.model.model_copy(update={"source": "/ckpt"})}
    )
    assert check_lengths(imported) == []


def test_word_problem_generator_is_deterministic_and_the_file_is_current():
    script = REPO / "scripts" / "make_word_problems.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_text_task_config_defaults_name_the_shipped_file():
    cfg = ExperimentConfig.model_validate({"task": {"name": "text"}})
    assert cfg.task.data_file == "word_problems.jsonl"
    assert cfg.task.verifier == "numeric"


@pytest.mark.slow
def test_text_task_on_an_imported_model_counts_lengths_in_its_tokens(tmp_path):
    """With model.source the prompts are encoded by the checkpoint's tokenizer, and
    the lengths are checked in its tokens once it is installed."""
    pytest.importorskip("transformers")
    from hf_tiny_checkpoints import (
        save_char_tokenizer,
        save_hf_checkpoint,
        word_problem_characters,
    )

    from trainer.config.presets import preset_dict
    from trainer.hf import resolve_model_source
    from trainer.hf.tokenizer import CheckpointTokenizer, install_checkpoint_tokenizer

    save_hf_checkpoint("qwen3_moe", tmp_path)
    save_char_tokenizer(tmp_path, word_problem_characters())
    data = preset_dict("text-grpo") | {"model": {"source": str(tmp_path), "max_seq_len": 128}}
    cfg = resolve_model_source(validate_config(data))
    task = make_task(cfg.task)
    install_checkpoint_tokenizer(task, cfg)
    assert isinstance(task.tokenizer, CheckpointTokenizer)
    problem = task.build(0)
    ids = task.tokenizer.encode(problem.prompt)
    assert ids[0] == task.tokenizer.bos_id and len(ids) == len(problem.prompt) + 1
    assert task.tokenizer.decode(task.tokenizer.encode(problem.target, bos=False)) == problem.target
    # the longest answers, two steps such as "5 * 10 = 50\n50 - 8 = 42\n#### 42": 31 characters + EOS
    assert task.max_target_len == 32
    short = cfg.model_copy(
        update={"rollout": cfg.rollout.model_copy(update={"max_new_tokens": 16})}
    )
    fresh = make_task(short.task)
    with pytest.raises(FieldError) as info:
        install_checkpoint_tokenizer(fresh, short)
    assert info.value.errors[0][0] == "rollout.max_new_tokens"


def test_a_trainer_that_cannot_see_the_data_file_fails_with_a_field_error(tmp_path, capsys):
    from trainer.cli import main as cli_main
    from trainer.errors import BAD_INPUT_EXIT_CODE

    missing = tmp_path / "gsm8k" / "train.jsonl"
    code = cli_main(
        ["run", "--preset", "text-grpo", "--set", f"task.data_file={missing}",
         "--out", str(tmp_path / "run")]
    )  # fmt: skip
    assert code == BAD_INPUT_EXIT_CODE
    err = capsys.readouterr().err
    assert f"task.data_file: {missing} does not exist" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_overlong_prompts_are_dropped_in_the_tokens_the_run_speaks(tmp_path):
    """task.max_prompt_tokens: rows whose prompt (BOS included) takes more tokens are
    skipped and counted with their lines, once the run's tokens are known; a config
    whose longest prompt would not fit model.max_seq_len validates when the limit
    drops it."""
    rows = [{"question": "1+2=?", "answer": "#### 3"}, {"question": "12+30=?", "answer": "#### 42"},
            {"question": "x" * 40 + " 5+5=?", "answer": "#### 10"}] * 4  # fmt: skip
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    task = text_task(path, max_prompt_tokens=10)
    assert len(task.train_table.problems) == 12  # bytes of a placeholder: nothing dropped yet
    task.tokens_known()
    report = task.data_report()["data_file"]
    assert report["problems"] == 8 and report["bad_row_reasons"] == {
        "prompt longer than max_prompt_tokens=10": 4
    }
    assert report["bad_row_lines"]["prompt longer than max_prompt_tokens=10"] == [3, 6, 9, 12]
    assert task.max_prompt_len <= 10
    base = {"task": {"name": "text", "data_file": str(path)}, "model": {"max_seq_len": 48},
            "rollout": {"max_new_tokens": 16}}  # fmt: skip
    with pytest.raises(FieldError) as info:
        validate_config(base)
    assert "model.max_seq_len" in info.value.as_dict()
    limited = validate_config({**base, "task": {**base["task"], "max_prompt_tokens": 16}})
    assert limited.task.max_prompt_tokens == 16


@pytest.mark.slow
def test_the_token_limit_counts_the_checkpoints_tokens_not_bytes(tmp_path):
    """Before the checkpoint's tokenizer is installed nothing is dropped (bytes would
    overcount); after it, prompts are measured with it, chat template included."""
    from hf_tiny_checkpoints import save_char_tokenizer

    from trainer.hf.tokenizer import CheckpointTokenizer

    save_char_tokenizer(tmp_path, "0123456789+=?x ")
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    )
    rows = [
        {"question": "1+2=?", "answer": "#### 3"},
        {"question": "xxxx 5+5=?", "answer": "#### 10"},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows * 3)
    task = text_task(path, max_prompt_tokens=9)
    task.tokenizer = CheckpointTokenizer(tmp_path, chat_template=True)
    task.tokens_known()
    # "1+2=?" renders as "<1+2=?>": 7 tokens, kept; the other, 12 tokens, dropped
    assert [p.prompt for p in task.train_table.problems] == ["1+2=?"] * 3
    assert task.data_report()["data_file"]["bad_rows"] == 3
