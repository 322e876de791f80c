"""Config validation that needs more than the schema: field errors by dotted path
and the task-dependent length check.

``trainer.config`` stays the pure schema (it imports no task); this module sits
above both (see docs/design.md, "contracts: config schema").
"""

from __future__ import annotations

import copy
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
    Every error is reported at once (``all_errors``): one submit shows them all.
    """
    if not isinstance(data, dict):
        raise FieldError([("", "the config must be a JSON object")])
    cfg, errors = all_errors(data)
    if errors:
        raise FieldError(errors)
    return cfg


def all_errors(
    data: dict[str, Any], *, lengths: bool = True
) -> tuple[ExperimentConfig | None, list[tuple[str, str]]]:
    """(the config, []), or (the config with the fields in error at their defaults,
    every error), or (None, every error) when no config could be made. Pydantic checks the fields first and
    the rules across fields only once they are valid, so the fields in error are
    set aside (their defaults stand in) and the rest checked again, up to
    ``REPAIR_ROUNDS`` times: a wrong type, a rule across two other fields and a
    task length come back from one call. An error found on a config whose
    stand-in defaults it involves is left out (it would speak of a value the
    user did not give). ``lengths=False`` leaves out the task's length check, which
    builds the task and reads its data (for a caller that refused a path or a
    reward function: nothing it names may be opened)."""
    errors: list[tuple[str, str]] = []
    set_aside: set[str] = set()
    current = copy.deepcopy(data)
    for _ in range(REPAIR_ROUNDS):
        try:
            cfg = ExperimentConfig.model_validate(current)
        except ValidationError as exc:
            found = [(p, m) for p, m in _errors_from_pydantic(exc) if (p, m) not in errors]
            fresh = [(p, m) for p, m in found if not _involves(p, set_aside)]
            errors += fresh
            removable = [p for p, _ in fresh if p and _drop(current, p)]
            if not removable:
                return None, errors
            set_aside.update(removable)
            continue
        # Lengths depend on the task's formats, so they are checked against the task itself.
        if lengths:
            errors += [(p, m) for p, m in check_lengths(cfg) if not _involves(p, set_aside)]
        return cfg, errors
    return None, errors


REPAIR_ROUNDS = 4


def _involves(path: str, set_aside: set[str]) -> bool:
    return any(path == p or path.startswith(p + ".") or p.startswith(path + ".") for p in set_aside)


def _drop(data: dict[str, Any], path: str) -> bool:
    """Remove the value at dotted ``path`` (its default then applies); False when
    there is none to remove."""
    keys = path.split(".")
    node: Any = data
    for key in keys[:-1]:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    if isinstance(node, dict) and keys[-1] in node:
        del node[keys[-1]]
        return True
    return False
