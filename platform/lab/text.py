"""Text a user typed, checked before it is stored or used in a query.

PostgreSQL refuses NUL in text (``A string literal cannot contain NUL``) and
``\\u0000`` in jsonb, and no encoder takes a lone UTF-16 surrogate
(``"\\ud800"`` in a JSON body): left unchecked, each is a 500 on the write or
query that meets it. Other control characters are refused in single-line
fields (names, tags, filters), where they can only be a mistake or an attack on
whoever reads the text later; multi-line text (comments, descriptions) keeps
tab and newlines.
"""

from __future__ import annotations

import re
from typing import Any

from trainer.errors import FieldError

# C0 controls, DEL and lone surrogates; never valid in a single-line field.
SINGLE_LINE_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
# Multi-line text may hold tab, newline and carriage return.
MULTI_LINE_FORBIDDEN = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
# What no stored text may hold (JSON values and keys included).
NEVER_STORABLE = re.compile(r"[\x00\ud800-\udfff]")


def forbidden_character(value: str, multiline: bool = False) -> str | None:
    """A description of the first character ``value`` may not hold, or None."""
    pattern = MULTI_LINE_FORBIDDEN if multiline else SINGLE_LINE_FORBIDDEN
    match = pattern.search(value)
    if match is None:
        return None
    char = match.group()
    return f"U+{ord(char):04X} ({'a surrogate' if 0xD800 <= ord(char) <= 0xDFFF else 'a control character'})"


def clean_text(
    field: str,
    value: Any,
    *,
    max_length: int,
    multiline: bool = False,
    required: bool = False,
    label: str | None = None,
) -> str:
    """``value`` stripped; FieldError naming ``field`` when it is not text, is
    empty but ``required``, is longer than ``max_length`` or holds a character
    it may not."""
    label = label or field
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise FieldError([(field, f"{label} must be text")])
    value = value.strip()
    if required and not value:
        raise FieldError([(field, f"{label} cannot be empty")])
    if len(value) > max_length:
        raise FieldError([(field, f"{label} holds at most {max_length} characters")])
    bad = forbidden_character(value, multiline)
    if bad:
        raise FieldError([(field, f"{label} cannot contain {bad}")])
    return value


def unstorable_strings(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``(path, message)`` for every string (key or value) in a JSON-like value
    that no database column may hold: NUL or a lone surrogate.

    Iterative, so any depth the parser let through is walked without recursion.
    """
    errors: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = [(prefix, data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if NEVER_STORABLE.search(value):
                errors.append((path, "text cannot contain NUL (U+0000) or a lone surrogate"))
        elif isinstance(value, dict):
            for key, item in value.items():
                key_text = str(key)
                child = f"{path}.{key_text}" if path else key_text
                if isinstance(key, str) and NEVER_STORABLE.search(key):
                    errors.append((path or "__all__", "a key cannot contain NUL or a surrogate"))
                    continue
                stack.append((child, item))
        elif isinstance(value, list | tuple):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(value))
    return sorted(errors)
