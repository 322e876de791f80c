"""Config validation that needs more than the schema: field errors by dotted path
and the task-dependent length check.

``trainer.config`` stays the pure schema (it imports no task); this module sits
above both (see docs/design.md, "contracts: config schema").
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from trainer.config import ExperimentConfig
from trainer.config.migration import TASK_KINDS
from trainer.errors import FieldError
from trainer.tasks.factory import check_lengths

_FIELD_PREFIX = re.compile(r"^([a-z_][a-z0-9_.]*): ")


def _errors_from_pydantic(exc: ValidationError) -> list[tuple[str, str]]:
    errors = []
    for err in exc.errors():
        # The task union puts its tag in the location (task.sort.min_len): drop it.
        loc = [
            str(p)
            for i, p in enumerate(err["loc"])
            if not (i == 1 and err["loc"][0] == "task" and p in TASK_KINDS)
        ]
        path = ".".join(loc)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling against `python -m trainer schema`"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
            # Model validators name their field as "field: message" (see _check_*).
            match = _FIELD_PREFIX.match(msg)
            if match:
                path = ".".join(p for p in (path, match.group(1)) if p)
                msg = msg[match.end() :]
        errors.append((path, msg))
    return errors


def validate_config(data: dict[str, Any]) -> ExperimentConfig:
    """Validate a (possibly partial) nested dict; raise FieldError naming fields.

    Checks types, ranges and cross-field rules, then that the task's prompts
    and responses fit ``rollout.max_new_tokens`` and ``model.max_seq_len``.
    """
    if not isinstance(data, dict):
        raise FieldError([("", "the config must be a JSON object")])
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise FieldError(_errors_from_pydantic(exc)) from None
    # Lengths depend on the task's formats, so they are checked against the task itself.
    errors = check_lengths(cfg)
    if errors:
        raise FieldError(errors)
    return cfg
