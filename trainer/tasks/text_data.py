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

import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import TextTaskConfig
from trainer.errors import FieldError
from trainer.tasks.base import Problem
from trainer.tasks.verifiers import GSM8K_MARKER, BadRow, NumericVerifier, Verifier

SHIPPED_DATA = Path(__file__).resolve().parent.parent / "task_data"
FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


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


def read_rows(file: Path, path: str) -> list[dict[str, Any]]:
    """Every row of ``file`` as a dict (the ``datasets`` library; a private cache
    folder so concurrent runs never share or keep Arrow caches)."""
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
        return table.to_list()


@dataclass
class ProblemTable:
    """The usable problems of a file and what was skipped."""

    problems: list[Problem] = field(default_factory=list)
    rows: int = 0
    bad_rows: Counter[str] = field(default_factory=Counter)  # reason -> count

    @property
    def n_bad(self) -> int:
        return sum(self.bad_rows.values())


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


def target_text(raw: Any, gold: str, verifier: Verifier) -> str:
    """The supervised warm-start response: the answer field when the verifier reads
    it back to the gold answer, else the gold answer in GSM8K form (numeric)."""
    text = raw if isinstance(raw, str) else str(raw)
    if verifier.is_correct(text, gold):
        return text
    return f"{GSM8K_MARKER} {gold}" if isinstance(verifier, NumericVerifier) else gold


def build_problems(
    rows: list[dict[str, Any]], cfg: TextTaskConfig, verifier: Verifier
) -> ProblemTable:
    table = ProblemTable(rows=len(rows))
    for row in rows:
        try:
            prompt = prompt_text(row, cfg)
            raw = row.get(cfg.answer_field)
            if raw is None:
                raise BadRow(f"answer field {cfg.answer_field!r} is missing")
            gold = verifier.gold(raw)
        except BadRow as exc:
            table.bad_rows[str(exc)] += 1
            continue
        table.problems.append(
            Problem(prompt=prompt, answer=gold, target=target_text(raw, gold, verifier))
        )
    return table
