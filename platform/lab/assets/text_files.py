"""Where a data file stops being UTF-8 text, for an error that names the line.

The ``datasets`` reader fails on a non-UTF-8 row with a bare
``UnicodeDecodeError`` (no file, no line); the platform turns that into a
field error on the config field or form field that named the file.
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.errors import FieldError
from trainer.tasks.text_data import SHIPPED_DATA

CHUNK_BYTES = 1 << 20


def first_undecodable_line(file: Path) -> int | None:
    """The 1-based line of ``file``'s first byte that is not UTF-8, or None.
    Streams the file in 1 MiB chunks (memory stays bounded at any file size)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    try:
        with open(file, "rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    return line + chunk[: exc.start].count(b"\n")
                line += chunk.count(b"\n")
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return line
    except OSError:
        return None
    return None


def not_utf8_error(field: str, file: Path, exc: UnicodeDecodeError) -> FieldError:
    line = first_undecodable_line(file)
    where = f"line {line}" if line is not None else "a row"
    return FieldError(
        [(field, f"{file}: {where} is not UTF-8 text ({exc.reason}); save the file as UTF-8")]
    )


def config_decode_error(
    data: Mapping[str, Any], exc: UnicodeDecodeError, prefix: str
) -> FieldError:
    """The field error for a run config whose data file (or eval file) is not UTF-8."""
    task = data.get("task") if isinstance(data.get("task"), Mapping) else {}
    for name in ("data_file", "eval_file"):
        value = task.get(name)
        if not isinstance(value, str) or not value:
            continue
        file = Path(value).expanduser()
        file = file if file.is_absolute() else SHIPPED_DATA / file
        if first_undecodable_line(file) is not None:
            return not_utf8_error(f"{prefix}task.{name}", file, exc)
    return FieldError([(f"{prefix}task.data_file", f"a row is not UTF-8 text ({exc.reason})")])
