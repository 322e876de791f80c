"""Read a text task's data file into problems, counting the rows that cannot be used.

    rows = read_rows(resolve_data_file("word_problems.jsonl", "task.data_file"), "task.data_file")
    table = build_problems(rows, cfg, verifier)     # table.problems, table.bad_rows

Files are read with the ``datasets`` library (JSON lines, JSON, Parquet). A
row with a missing or empty prompt/answer field, a prompt template that names
a field the row lacks, or an answer the verifier cannot parse is skipped and
counted by reason (``ProblemTable.bad_rows``), never a crash; a file that
does not exist or does not parse is a field error.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import TextTaskConfig
from trainer.errors import FieldError
from trainer.tasks.base import Problem
from trainer.tasks.verifiers import BadRow, Verifier

SHIPPED_DATA = Path(__file__).resolve().parent.parent / "task_data"
FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
MAX_LINES_PER_REASON = 5  # line numbers kept per skip reason (the count is exact)
# A JSON line longer than this is skipped unread (never held whole in memory): four
# times the longest prompt task.max_prompt_chars allows, in UTF-8, with room for its answer.
MAX_LINE_BYTES = 16 * 1024 * 1024


def resolve_data_file(value: str, path: str) -> Path:
    """The file ``value`` names: an absolute path, or a file shipped in ``trainer/task_data``.

    ``path`` is the config field (``task.data_file``) the errors name.
    """
    candidate = Path(value).expanduser()
    if not candidate.is_absolute():
        shipped = SHIPPED_DATA / value
        if shipped.is_file():
            return shipped
        names = sorted(p.name for p in SHIPPED_DATA.glob("*") if p.suffix in FORMATS)
        raise FieldError(
            [
                (
                    path,
                    f"{value!r} is neither an absolute path nor a file shipped with the lab "
                    f"({', '.join(names)}); give the absolute path on the run volume",
                )
            ]
        )
    if not candidate.is_file():
        raise FieldError(
            [
                (
                    path,
                    f"{candidate} does not exist or is not a file on the machine running the trainer",
                )
            ]
        )
    if candidate.suffix.lower() not in FORMATS:
        raise FieldError([(path, f"{candidate.name}: use a .jsonl, .json or .parquet file")])
    return candidate


@dataclass
class RowsRead:
    """A data file's rows, the line (JSON lines: 1-based) or row number (others:
    0-based index) of each, and the lines that could not be read at all."""

    rows: list[dict[str, Any]]
    lines: list[int]
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line, reason)


def read_table(file: Path, path: str) -> RowsRead:
    """Every row of ``file``. JSON lines are read line by line here: a line that is
    not UTF-8, not JSON or not an object is skipped and recorded with its line
    number, never the end of the file. JSON and Parquet go through the
    ``datasets`` library (a private cache folder so concurrent runs never share
    or keep Arrow caches); a file that does not parse is a field error."""
    if file.suffix.lower() == ".jsonl":
        return _read_jsonl(file, path)
    import datasets

    datasets.disable_progress_bars()
    builder = FORMATS[file.suffix.lower()]
    with tempfile.TemporaryDirectory(prefix="lab-text-task-") as cache:
        try:
            table = datasets.load_dataset(
                builder, data_files=str(file), split="train", cache_dir=cache, keep_in_memory=True
            )
        except Exception as exc:  # the library raises many kinds for a malformed file
            cause = exc.__cause__ or exc
            raise FieldError(
                [(path, f"{file} does not parse as {builder}: {type(cause).__name__}: {cause}")]
            ) from None
        rows = table.to_list()
    return RowsRead(rows=rows, lines=list(range(len(rows))))


def _read_jsonl(file: Path, path: str) -> RowsRead:
    out = RowsRead(rows=[], lines=[])
    try:
        handle = file.open("rb")
    except OSError as exc:
        raise FieldError([(path, f"{file} cannot be read: {exc.strerror or exc}")]) from None
    with handle:
        number = 0
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(raw.rstrip(b"\r\n")) > MAX_LINE_BYTES:
                # Never held whole: the rest of the line is read past in chunks.
                while not raw.endswith(b"\n") and (raw := handle.readline(1 << 20)):
                    pass
                out.skipped.append((number, f"line longer than {MAX_LINE_BYTES >> 20} MiB"))
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                out.skipped.append((number, "not UTF-8 text"))
                continue
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                out.skipped.append((number, f"not valid JSON ({exc.msg})"))
                continue
            except RecursionError:
                out.skipped.append((number, "not valid JSON (nested too deeply)"))
                continue
            if not isinstance(row, dict):
                out.skipped.append((number, "not a JSON object"))
                continue
            out.rows.append(row)
            out.lines.append(number)
    return out


def read_rows(file: Path, path: str) -> list[dict[str, Any]]:
    """Every readable row of ``file`` as a dict (``read_table``)."""
    return read_table(file, path).rows


@dataclass
class ProblemTable:
    """The usable problems of a file and what was skipped."""

    problems: list[Problem] = field(default_factory=list)
    rows: int = 0
    bad_rows: Counter[str] = field(default_factory=Counter)  # reason -> count
    # reason -> the first line numbers (JSON lines: 1-based) of rows skipped for it
    bad_lines: dict[str, list[int]] = field(default_factory=dict)

    @property
    def n_bad(self) -> int:
        return sum(self.bad_rows.values())

    def skip(self, reason: str, line: int) -> None:
        self.bad_rows[reason] += 1
        lines = self.bad_lines.setdefault(reason, [])
        if len(lines) < MAX_LINES_PER_REASON:
            lines.append(line)

    def describe_bad(self, most: int = 3) -> str:
        """'2 x not valid JSON (lines 4, 9), ...' for the most common reasons."""
        return ", ".join(
            f"{n} x {why} (line{'s' if n > 1 else ''} "
            f"{', '.join(map(str, self.bad_lines.get(why, [])))}{', ...' if n > MAX_LINES_PER_REASON else ''})"
            for why, n in self.bad_rows.most_common(most)
        )


def prompt_text(row: dict[str, Any], cfg: TextTaskConfig) -> str:
    """The row's prompt (its prompt_field, or the prompt_template filled from its fields)."""
    if cfg.prompt_template is not None:
        missing = [k for k, v in row.items() if v is None]
        try:
            text = cfg.prompt_template.format_map(
                {k: v for k, v in row.items() if k not in missing}
            )
        except KeyError as exc:
            raise BadRow(f"prompt_template field {exc.args[0]!r} is missing") from None
        except (IndexError, ValueError) as exc:
            raise BadRow(f"prompt_template does not fill: {exc}") from None
    else:
        text = row.get(cfg.prompt_field)
        if text is None:
            raise BadRow(f"prompt field {cfg.prompt_field!r} is missing")
        if not isinstance(text, str):
            raise BadRow(f"prompt field {cfg.prompt_field!r} is not text")
    if not text.strip():
        raise BadRow("prompt is empty")
    return text


CHAT_ROLES = ("system", "user", "assistant")


def conversation(row: dict[str, Any], field_name: str) -> tuple[tuple[str, str], ...]:
    """The row's ``messages_field`` as ``(role, content)`` turns: a list of
    ``{"role", "content"}`` objects with roles system / user / assistant and text
    content, ending with a user turn (the question the policy answers)."""
    turns = row.get(field_name)
    if turns is None:
        raise BadRow(f"messages field {field_name!r} is missing")
    if not isinstance(turns, list) or not turns:
        raise BadRow(f"messages field {field_name!r} is not a non-empty list of turns")
    out = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise BadRow(f"messages field {field_name!r}: a turn is not an object")
        role, content = turn.get("role"), turn.get("content")
        if role not in CHAT_ROLES:
            raise BadRow(f"messages field {field_name!r}: role {role!r} is not one of {CHAT_ROLES}")
        if not isinstance(content, str):
            raise BadRow(f"messages field {field_name!r}: a {role} turn has no text content")
        out.append((role, content))
    if out[-1][0] != "user" or not out[-1][1].strip():
        raise BadRow(f"messages field {field_name!r}: the last turn is not a non-empty user turn")
    return tuple(out)


def build_problems(
    rows: list[dict[str, Any]] | RowsRead,
    cfg: TextTaskConfig,
    verifier: Verifier,
    prompt_tokens: Callable[[Problem], int] | None = None,
) -> ProblemTable:
    """The usable problems of ``rows``; every other row is skipped and counted by
    reason with its line number (``ProblemTable.bad_lines``). ``prompt_tokens``
    (a problem's prompt length in the run's tokens), when the tokens are known:
    prompts over ``cfg.max_prompt_tokens`` are skipped too."""
    read = rows if isinstance(rows, RowsRead) else RowsRead(list(rows), list(range(len(rows))))
    table = ProblemTable(rows=len(read.rows) + len(read.skipped))
    for line, reason in read.skipped:
        table.skip(reason, line)
    for line, row in zip(read.lines, read.rows, strict=True):
        try:
            messages = conversation(row, cfg.messages_field) if cfg.messages_field else ()
            prompt = messages[-1][1] if messages else prompt_text(row, cfg)
            chars = sum(len(text) for _, text in messages) if messages else len(prompt)
            if chars > cfg.max_prompt_chars:
                raise BadRow(f"prompt longer than max_prompt_chars={cfg.max_prompt_chars}")
            raw = row.get(cfg.answer_field)
            if raw is None:
                raise BadRow(f"answer field {cfg.answer_field!r} is missing")
            gold = verifier.gold(raw)
        except BadRow as exc:
            table.skip(str(exc), line)
            continue
        problem = Problem(
            prompt=prompt,
            answer=gold,
            target=verifier.target(raw, gold),
            messages=messages,
        )
        limit = cfg.max_prompt_tokens
        if prompt_tokens is not None and limit is not None and prompt_tokens(problem) > limit:
            table.skip(f"prompt longer than max_prompt_tokens={limit}", line)
            continue
        table.problems.append(problem)
    return table
