"""Bad rows of a data file are skipped and counted with their line numbers (a
non-UTF-8 line, malformed JSON, a non-object), never the end of the file or a
traceback; overlong prompts are filtered by a threshold the user sets; prompt
templates take plain {field} names only (no format specs that cost memory)."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from trainer.cli import main as cli_main
from trainer.config import TextTaskConfig
from trainer.config.task import DEFAULT_MAX_PROMPT_CHARS
from trainer.errors import BAD_INPUT_EXIT_CODE, FieldError
from trainer.tasks import make_task
from trainer.tasks.text_data import MAX_LINE_BYTES, build_problems, read_table
from trainer.tasks.verifiers import make_verifier
from trainer.validation import validate_config


def _row(i: int) -> bytes:
    return json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}).encode()


def _table(lines: list[bytes], tmp_path, **task):
    file = tmp_path / "data.jsonl"
    file.write_bytes(b"\n".join(lines) + b"\n")
    cfg = TextTaskConfig(data_file=str(file), **task)
    return build_problems(read_table(file, "task.data_file"), cfg, make_verifier("numeric"))


def test_unreadable_lines_are_skipped_with_their_line_numbers(tmp_path):
    lines = [_row(i) for i in range(8)]
    lines[2] = b'{"question": "caf\xe9", "answer": "#### 1"}'  # latin-1, not UTF-8
    lines[4] = b'{"question": "half a row'
    lines[6] = b"[1, 2]"
    table = _table(lines, tmp_path)
    assert len(table.problems) == 5 and table.rows == 8 and table.n_bad == 3
    by_reason = {why.split(" (")[0]: lines for why, lines in table.bad_lines.items()}
    assert by_reason == {"not UTF-8 text": [3], "not valid JSON": [5], "not a JSON object": [7]}


def test_a_broken_row_far_into_the_file_is_reported_at_its_line(tmp_path):
    lines = [_row(i) for i in range(1200)]
    lines[1000] = b'{"question": "What is 1 + 1?", "answer": '
    table = _table(lines, tmp_path)
    assert table.bad_lines == {"not valid JSON (Expecting value)": [1001]}
    assert "line 1001" in table.describe_bad()


def test_overlong_prompts_are_filtered_and_counted(tmp_path):
    lines = [_row(i) for i in range(6)]
    lines[1] = json.dumps({"question": "x" * 500, "answer": "#### 1"}).encode()
    table = _table(lines, tmp_path, max_prompt_chars=100)
    assert len(table.problems) == 5
    assert table.bad_lines == {"prompt longer than max_prompt_chars=100": [2]}


@pytest.mark.parametrize(
    "template", ["{question:>10000000}", "{question!r}", "{question.__class__}", "{0}", "{a[0]}"]
)
def test_prompt_templates_take_plain_field_names_only(template):
    with pytest.raises(FieldError) as exc:
        validate_config({"task": {"name": "text", "prompt_template": template}})
    assert "task.prompt_template" in exc.value.as_dict()


def test_a_file_of_unreadable_rows_is_a_field_error_naming_lines(tmp_path, capsys):
    file = tmp_path / "data.jsonl"
    file.write_bytes(b'{"question": "\xff\xfe", "answer": "#### 1"}\n{"q": 1\n')
    out = tmp_path / "run"
    code = cli_main(
        ["run", "--preset", "text-grpo", "--set", f"task.data_file={file}", "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert code == BAD_INPUT_EXIT_CODE and "Traceback" not in err
    assert "task.data_file" in err and "line 1" in err and "line 2" in err
    assert not out.exists()


def test_prompts_are_bounded_by_default(tmp_path):
    """No max_prompt_chars given (or a stored null): the default bound still skips a
    prompt no model could hold."""
    assert TextTaskConfig().max_prompt_chars == DEFAULT_MAX_PROMPT_CHARS
    assert TextTaskConfig(max_prompt_chars=None).max_prompt_chars == DEFAULT_MAX_PROMPT_CHARS
    lines = [_row(i) for i in range(6)]
    lines[3] = json.dumps(
        {"question": "y" * (DEFAULT_MAX_PROMPT_CHARS + 1), "answer": "#### 1"}
    ).encode()
    table = _table(lines, tmp_path)
    assert len(table.problems) == 5
    assert table.bad_lines == {
        f"prompt longer than max_prompt_chars={DEFAULT_MAX_PROMPT_CHARS}": [4]
    }


def test_a_huge_line_is_skipped_without_being_held(tmp_path):
    """The review's 50 MB prompt line (here 100 MB): skipped at read, counted with its
    line number, while reading holds at most about the line bound; validation and the
    task go on with the other rows."""
    file = tmp_path / "data.jsonl"
    with file.open("wb") as out:
        for i in range(10):
            out.write(_row(i) + b"\n")
        out.write(b'{"question": "' + b"z" * (100 * 1024 * 1024) + b'", "answer": "#### 1"}\n')
        out.write(b"[" * 100_000 + b"]" * 100_000 + b"\n")  # nested past the JSON parser's stack
        out.write(_row(10) + b"\n")
    tracemalloc.start()
    try:
        read = read_table(file, "task.data_file")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * MAX_LINE_BYTES, peak  # the line is over six times that
    assert [line for line, _ in read.skipped] == [11, 12]
    assert read.skipped[0][1] == f"line longer than {MAX_LINE_BYTES >> 20} MiB"
    assert read.skipped[1][1] == "not valid JSON (nested too deeply)"
    cfg = validate_config(
        {"task": {"name": "text", "data_file": str(file)}, "model": {"max_seq_len": 128}}
    )
    assert make_task(cfg.task).data_report()["data_file"]["problems"] == 11
