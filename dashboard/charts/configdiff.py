"""Config diff for the compare page: only the fields whose values differ."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

MISSING = object()


def flatten(config: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """{"model.n_experts": 8, ...}: dotted paths to leaf values (lists are leaves)."""
    out: dict[str, Any] = {}
    for key, value in (config or {}).items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def config_diff(configs: Sequence[Mapping[str, Any] | None]) -> list[tuple[str, list[Any]]]:
    """[(path, [value per config])] for every path whose values are not all equal,
    in path order. A path absent from a config gives ``MISSING`` there."""
    flat = [flatten(c) for c in configs]
    paths = sorted({p for f in flat for p in f})
    rows = []
    for path in paths:
        values = [f.get(path, MISSING) for f in flat]
        encoded = {"\0missing" if v is MISSING else json.dumps(v, sort_keys=True) for v in values}
        if len(encoded) > 1:
            rows.append((path, values))
    return rows


def display_value(value: Any) -> str:
    if value is MISSING:
        return "-"
    if isinstance(value, str):
        return value
    return json.dumps(value)
