"""JSON from users, bounded before it is parsed.

Python's JSON decoder recurses once per nesting level, so a 2 KB body of
``[[[[...`` ends in ``RecursionError`` (a 500) and every recursive walk after
it is at risk too. The raw text's depth is counted iteratively first and
anything deeper than ``MAX_JSON_DEPTH`` is refused as bad input; configs nest
4 levels, sweep grids 3. ``Infinity``/``NaN`` literals are refused too (they
are not JSON; ``1e400`` parses to inf and the config schema refuses it with
its field path), and so is text no database column may hold.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser

from lab.text import unstorable_strings

MAX_JSON_DEPTH = 32
# A JSON string literal (escapes included); brackets inside one do not nest.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class JSONTooDeep(ValueError):
    """The text nests arrays/objects deeper than ``MAX_JSON_DEPTH``."""


def json_depth(text: str) -> int:
    """Deepest nesting of arrays and objects in ``text`` (valid JSON or not), without recursion."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth = max(0, depth - 1)
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; give a finite number")


def loads(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` for user text: ValueError (JSONTooDeep, JSONDecodeError or
    a non-finite literal) instead of a RecursionError."""
    depth = json_depth(text)
    if depth > max_depth:
        raise JSONTooDeep(f"nested {depth} levels deep; at most {max_depth} are accepted")
    return json.loads(text, parse_constant=_refuse_constant)


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser behind the depth bound; strings no column may hold are
    refused with their field paths."""

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", "utf-8")
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"JSON parse error - the body is not {encoding} text") from exc
        try:
            data = loads(text)
        except RecursionError:  # a bound above the interpreter's own; never with the default
            raise ParseError("JSON parse error - nested too deeply") from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        errors = unstorable_strings(data)
        if errors:
            out: dict[str, list[str]] = {}
            for path, message in errors:
                out.setdefault(path or "__all__", []).append(message)
            raise ValidationError(out)
        return data
