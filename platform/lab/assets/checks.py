"""What registration checks on disk, through the trainer's own readers (so the
platform accepts exactly what a run will load). Every failure is a FieldError
naming the form/API field: ``path``, ``prompt_field``, ``prompt_template`` or
``answer_field``."""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lab.assets.prompt_cost import check_prompt_template
from lab.assets.text_files import not_utf8_error
from trainer.config import ModelConfig, TextTaskConfig
from trainer.errors import FieldError
from trainer.hf.families import SHAPE_FIELDS
from trainer.model.param_count import model_params


@dataclass(frozen=True)
class CheckpointFacts:
    family: str
    model_fields: dict[str, Any]
    total_params: int
    active_params: int
    vocab_size: int
    weight_bytes: int = 0  # tensor data a weight scan reads (check_weights)


@dataclass(frozen=True)
class DatasetFacts:
    rows: int
    problems: int
    bad_rows: dict[str, int]
    # reason -> {"count": n, "lines": the first line numbers}: rows skipped, not refused
    skipped: dict[str, dict] = field(default_factory=dict)


def _as_field(exc: FieldError, field: str, prefix: str = "") -> FieldError:
    return FieldError([(field, prefix + message) for _, message in exc.errors])


def inspect_checkpoint(path: str) -> CheckpointFacts:
    """The checkpoint folder ``path`` is absolute and exists, and loads:
    ``trainer.hf.validate.validate_checkpoint`` reads config.json, every
    safetensors header (never the weights) against the shapes config.json
    implies, and the tokenizer; each problem is an error on ``path`` naming the file."""
    from trainer.hf.families import model_fields_from_hf
    from trainer.hf.files import read_hf_config
    from trainer.hf.finite import weight_bytes
    from trainer.hf.tokenizer import CheckpointTokenizer
    from trainer.hf.validate import validate_checkpoint

    folder = Path(path)
    if not folder.is_absolute():
        raise FieldError([("path", "give the absolute path of the folder on the run volume")])
    if not folder.is_dir():
        raise FieldError([("path", f"{folder} is not a folder on this machine")])
    try:
        errors = validate_checkpoint(folder, field="path", tokenizer=True)
    except UnicodeDecodeError as exc:  # a config.json or index that is not UTF-8 text
        raise FieldError(
            [("path", f"a JSON file of the folder is not UTF-8 ({exc.reason})")]
        ) from None
    if errors:
        raise FieldError(errors)
    # Valid now: the facts the registry stores.
    fields = model_fields_from_hf(read_hf_config(folder))
    shape = {name: fields[name] for name in SHAPE_FIELDS}
    model = ModelConfig.model_validate(shape | {"source": str(folder)})
    tokens = CheckpointTokenizer(folder).vocab_size
    vocab = model.vocab_size or tokens
    return CheckpointFacts(
        family=model.family,
        model_fields=shape,
        total_params=model_params(model, vocab),
        active_params=model_params(model, vocab, active=True),
        vocab_size=tokens,
        weight_bytes=weight_bytes(folder),
    )


def check_weights(path: str, field: str = "path") -> None:
    """Every weight of the checkpoint is finite (``trainer.hf.finite``: the files read
    in chunks, no torch); a FieldError on ``field`` naming the tensors holding NaN or
    Inf. The time is the disk's: the registry runs it inline only for checkpoints up
    to LAB_MODEL_INLINE_BYTES."""
    from trainer.hf.finite import nonfinite_tensors

    bad = nonfinite_tensors(Path(path))
    if bad:
        raise FieldError([(field, f"tensor(s) holding NaN or infinite values: {', '.join(bad)}")])


def inspect_dataset(
    path: str, prompt_field: str, answer_field: str, prompt_template: str, verifier: str
) -> DatasetFacts:
    """The file exists and parses, its rows have the named fields, and at least two
    rows are usable problems for ``verifier``."""
    from trainer.tasks.text_data import build_problems, read_table, resolve_data_file
    from trainer.tasks.verifiers import make_verifier

    try:
        task = TextTaskConfig(
            data_file=path,
            prompt_field=prompt_field,
            answer_field=answer_field,
            prompt_template=prompt_template or None,
            verifier=verifier,
        )
    except ValidationError as exc:  # the field the schema names (prompt_template, verifier, ...)
        raise FieldError(
            [(".".join(str(p) for p in e["loc"]) or "verifier", e["msg"]) for e in exc.errors()]
        ) from None
    except ValueError as exc:
        raise FieldError([("verifier", str(exc))]) from None
    if prompt_template:
        check_prompt_template("prompt_template", prompt_template)
    file = resolve_data_file(path, "path")
    try:
        read = read_table(file, "path")
    except UnicodeDecodeError as exc:  # the reader's word for a non-UTF-8 row
        raise not_utf8_error("path", file, exc) from None
    rows = read.rows
    if not rows and read.skipped:
        # Unreadable lines are skipped and counted; a file with nothing else is refused.
        line, why = read.skipped[0]
        raise FieldError(
            [
                (
                    "path",
                    f"{file}: no row could be read ({len(read.skipped)} line(s) skipped; "
                    f"line {line}: {why})",
                )
            ]
        )
    columns = sorted({key for row in rows for key, value in row.items() if value is not None})
    known = f"the file's fields: {', '.join(columns) or 'none'}"
    if prompt_template:
        try:
            names = {n for _, n, _, _ in string.Formatter().parse(prompt_template) if n}
        except ValueError as exc:
            raise FieldError([("prompt_template", f"not a format string: {exc}")]) from None
        missing = sorted(names - set(columns))
        if missing:
            raise FieldError([("prompt_template", f"names {missing} that no row has; {known}")])
    elif prompt_field not in columns:
        raise FieldError([("prompt_field", f"no row has a field {prompt_field!r}; {known}")])
    if answer_field not in columns:
        raise FieldError([("answer_field", f"no row has a field {answer_field!r}; {known}")])
    table = build_problems(read, task, make_verifier(verifier, task.tolerance, task.choice_labels))
    if len(table.problems) < 2:
        reasons = ", ".join(f"{n} x {why}" for why, n in table.bad_rows.most_common(3))
        raise FieldError(
            [("answer_field", f"{len(table.problems)} usable rows of {table.rows} ({reasons})")]
        )
    return DatasetFacts(
        rows=table.rows,
        problems=len(table.problems),
        bad_rows=dict(table.bad_rows),
        skipped={
            why: {"count": n, "lines": table.bad_lines.get(why, [])}
            for why, n in table.bad_rows.most_common(20)
        },
    )


def _signature(folder: Path) -> tuple:
    """What the checkpoint's files are now (names, sizes, modification times)."""
    try:
        return tuple(
            sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir())
        )
    except OSError:
        return ()


_CHECKED: dict[tuple[str, tuple], CheckpointFacts] = {}


def check_model_source(source: str, field: str) -> CheckpointFacts | None:
    """A run's ``model.source`` checked like a registration (config.json, tokenizer,
    safetensors headers against the shapes), errors on ``field``. A folder checked
    before with the same files is not read again (a sweep names it once per run).
    None for the builtin model or a name that is not a path (left to the trainer)."""
    if source == "builtin" or not Path(source).expanduser().is_absolute():
        return None
    folder = Path(source).expanduser()
    key = (str(folder), _signature(folder))
    if key not in _CHECKED:
        try:
            facts = inspect_checkpoint(str(folder))
        except FieldError as exc:
            raise _as_field(exc, field) from None
        _CHECKED.clear()  # one entry is enough for a sweep; never grows
        _CHECKED[key] = facts
    return _CHECKED[key]
