"""The REST API's JSON parser: the depth-bounded reader of user JSON
(``lab.inputs.json_input.loads``) behind DRF's parser, and strings no database
column may hold refused with their field paths (``lab.text``)."""

from __future__ import annotations

from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser

from lab.inputs.json_input import loads
from lab.text import unstorable_strings


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
