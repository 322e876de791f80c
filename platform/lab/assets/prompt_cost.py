"""What a prompt template may cost, checked before any row is formatted.

``task.prompt_template`` is a Python format string filled from each row
(``str.format_map``). Its format specs are a way to make a tiny request
expensive: ``{question:>10000000}`` pads every prompt to ten million
characters (50 rows: +477 MB in the process that formats them), and
``{x:.100000f}`` does the same with digits. Fields with attribute or index
access (``{question.__class__}``) reach past the row's values. So a template
may name plain fields only, with widths and precisions up to
``MAX_FORMAT_NUMBER``, and no nested replacement fields in a spec (their
width would come from the data).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any

from trainer.errors import FieldError

MAX_FORMAT_NUMBER = 1000
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NUMBERS = re.compile(r"\d+")


def check_prompt_template(field: str, template: str) -> str:
    """``template`` unchanged, or a FieldError on ``field`` naming what is refused."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise FieldError([(field, f"not a format string: {exc}")]) from None
    for _, name, spec, _conversion in parts:
        if name is None:
            continue
        if not _FIELD_NAME.match(name):
            raise FieldError(
                [(field, f"{{{name}}}: name a row field only (no index, attribute or position)")]
            )
        if spec and "{" in spec:
            raise FieldError([(field, f"{{{name}:{spec}}}: no fields inside a format spec")])
        largest = max((int(n) for n in _NUMBERS.findall(spec or "")), default=0)
        if largest > MAX_FORMAT_NUMBER:
            raise FieldError(
                [
                    (
                        field,
                        f"{{{name}:{spec[:40]}}}: widths and precisions up to "
                        f"{MAX_FORMAT_NUMBER} characters (this one asks for {largest})",
                    )
                ]
            )
    return template


def check_config_template(data: Mapping[str, Any], prefix: str = "") -> None:
    """The prompt template of a run config (a nested dict, before validation)."""
    task = data.get("task")
    template = task.get("prompt_template") if isinstance(task, Mapping) else None
    if isinstance(template, str) and template:
        check_prompt_template(f"{prefix}task.prompt_template", template)
