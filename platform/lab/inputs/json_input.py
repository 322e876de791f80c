"""JSON from users, bounded in depth.

Python's JSON decoder recurses once per nesting level, so a 2 KB body of
``[[[[...`` ends in ``RecursionError`` (a 500) and every recursive walk after
it is at risk too. The depth is counted iteratively (of the parsed value, or of
the raw text when parsing fails) and anything deeper than ``MAX_JSON_DEPTH`` is
refused as bad input; configs nest 4 levels, sweep grids 3. ``Infinity``/``NaN``
literals are refused too (they are not JSON; ``1e400`` parses to inf and the
config schema refuses it with its field path). The REST API's parser
(``lab.api.json_parser``) also refuses text no database column may hold; the
pages (dashboard.web) and the tracking API (``lab.tracking.payload``) read their
JSON with ``loads``.
"""

from __future__ import annotations

import json
import re
from typing import Any

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


def value_depth(value: Any) -> int:
    """Deepest nesting of lists and dicts in a parsed value (``json_depth`` of its text),
    level by level, without recursion."""
    deepest = 0
    level = [value] if type(value) is dict or type(value) is list else []
    while level:
        deepest += 1
        below = []
        for node in level:
            for child in node.values() if type(node) is dict else node:
                if type(child) is dict or type(child) is list:
                    below.append(child)
        level = below
    return deepest


def loads(
    text: str, max_depth: int = MAX_JSON_DEPTH, constant_hint: str = "give a finite number"
) -> Any:
    """``json.loads`` for user text: ValueError (JSONTooDeep, JSONDecodeError or
    a non-finite literal, whose message ends with ``constant_hint``) instead of a
    RecursionError.

    The C decoder parses first: it guards its own recursion (a RecursionError, not a
    crash), and walking the parsed value costs a tenth of scanning the text for
    brackets outside strings (a 1,000-point MLflow batch: 0.3 ms against 3 ms). The
    text is scanned only for what fails, so a deep text is named as too deep whether or
    not it is valid."""

    def refuse_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number; {constant_hint}")

    try:
        value = json.loads(text, parse_constant=refuse_constant)
    except (RecursionError, ValueError):
        depth = json_depth(text)
        if depth <= max_depth:
            raise
    else:
        depth = value_depth(value)
        if depth <= max_depth:
            return value
    raise JSONTooDeep(f"nested {depth} levels deep; at most {max_depth} are accepted")
