"""Config dicts: deep merge and ``--set a.b=value`` overrides (CLI, presets, sweeps)."""

from __future__ import annotations

import copy
import json
from typing import Any

from trainer.errors import FieldError


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursively merge ``override`` into a copy of ``base`` (lists are replaced)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is JSON when it parses, else a plain string."""
    if "=" not in item:
        raise FieldError([(item, "an override must look like section.field=value")])
    path, raw = item.split("=", 1)
    keys = [k for k in path.strip().split(".") if k]
    if not keys:
        raise FieldError([(item, "an override needs a field path before '='")])
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return keys, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set a.b=value`` overrides to a nested dict (copy)."""
    out = copy.deepcopy(data)
    for item in overrides:
        keys, value = parse_override(item)
        node = out
        for key in keys[:-1]:
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            elif not isinstance(child, dict):
                raise FieldError([(".".join(keys), f"'{key}' is not a section")])
            node = child
        node[keys[-1]] = value
    return out
