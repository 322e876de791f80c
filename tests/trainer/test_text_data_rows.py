"""Bad rows of a data file are skipped and counted with their line numbers (a
non-UTF-8 line, malformed JSON, a non-object), never the end of the file or a
traceback; overlong prompts are filtered by a threshold the user sets; prompt
templates take plain {field} names only (no format specs that cost memory)."""

from __future__ import annotations

import json

import pytest

from trainer.cli import main as cli_main
from trainer.config import TextTaskConfig
from trainer.errors import BAD_INPUT_EXIT_CODE, FieldError
from trainer.tasks.text_data import build_problems, read_table
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
