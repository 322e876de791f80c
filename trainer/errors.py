"""The one error type for bad input: dotted field paths mapped to messages.

Config validation, the CLI's overrides, the API's query parameters, comment
bodies and queue names all raise ``FieldError``, so the CLI (exit code
``BAD_INPUT_EXIT_CODE``), the API (400 JSON ``{"errors": {path: [messages]}}``)
and the browser form (inline errors) report every kind of bad input the same
way, naming the field that needs fixing.
"""

from __future__ import annotations

# Exit status of the trainer CLI and of a trainer child whose config is invalid;
# the worker reads it to fail a run with the field errors instead of retrying it.
BAD_INPUT_EXIT_CODE = 2


class FieldError(ValueError):
    """Bad input; ``errors`` lists ``(dotted_path, message)`` pairs.

    An empty path means the input as a whole (shown as ``__all__``).
    """

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{path}: {msg}" if path else msg for path, msg in errors))

    def as_dict(self) -> dict[str, list[str]]:
        """``{path: [messages]}``, the shape the API and the form render."""
        out: dict[str, list[str]] = {}
        for path, msg in self.errors:
            out.setdefault(path or "__all__", []).append(msg)
        return out
