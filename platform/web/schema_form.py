"""The new-run form, generated from the config's JSON Schema (trainer.config).

Every field of the ONE schema becomes an input with its default, help text and
bounds; sections follow the schema (model, task, rollout, ...), nested objects
become sub-sections. Values the browser sends are converted to the schema's
types where they parse; anything that does not parse is passed through as
typed, so the schema itself reports the error at the field's path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trainer.config import json_schema


@dataclass
class FormField:
    path: str  # dotted config path, also the input's name
    label: str
    kind: str  # integer | number | boolean | enum | array | string
    help: str
    default: Any
    nullable: bool = False
    choices: list[Any] = field(default_factory=list)
    minimum: float | None = None
    maximum: float | None = None
    value: Any = None
    errors: list[str] = field(default_factory=list)

    @property
    def input_value(self) -> str:
        """The value as the input shows it."""
        value = self.value
        if value is None:
            return ""
        if self.kind == "array":
            return ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)
        return str(value)

    @property
    def bounds(self) -> str:
        parts = []
        if self.minimum is not None:
            parts.append(f"min {self.minimum:g}")
        if self.maximum is not None:
            parts.append(f"max {self.maximum:g}")
        return ", ".join(parts)


@dataclass
class FormSection:
    path: str
    title: str
    fields: list[FormField] = field(default_factory=list)
    subsections: list[FormSection] = field(default_factory=list)


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return defs[node["$ref"].rsplit("/", 1)[-1]]
    return node


def _field(path: str, prop: dict[str, Any]) -> FormField:
    nullable = False
    spec = prop
    if "anyOf" in prop:
        options = [o for o in prop["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(prop["anyOf"])
        spec = {**prop, **options[0]}
    kind = spec.get("type", "string")
    choices: list[Any] = []
    if "enum" in spec:
        kind, choices = "enum", list(spec["enum"])
    minimum = spec.get("minimum", spec.get("exclusiveMinimum"))
    maximum = spec.get("maximum", spec.get("exclusiveMaximum"))
    if kind == "array" and "enum" in spec.get("items", {}):
        choices = list(spec["items"]["enum"])
    return FormField(
        path=path,
        label=path.rsplit(".", 1)[-1],
        kind=kind,
        help=prop.get("description", ""),
        default=prop.get("default"),
        nullable=nullable,
        choices=choices,
        minimum=minimum,
        maximum=maximum,
    )


def build_sections(schema: dict[str, Any] | None = None) -> list[FormSection]:
    schema = schema or json_schema()
    defs = schema.get("$defs", {})

    def section(path: str, node: dict[str, Any]) -> FormSection:
        node = _resolve(node, defs)
        out = FormSection(path=path, title=path.rsplit(".", 1)[-1].replace("_", " "))
        for name, prop in node.get("properties", {}).items():
            child = f"{path}.{name}"
            resolved = _resolve(prop, defs)
            if resolved.get("type") == "object" and "properties" in resolved:
                out.subsections.append(section(child, resolved))
            else:
                out.fields.append(_field(child, prop))
        return out

    return [section(name, prop) for name, prop in schema["properties"].items()]


def iter_fields(sections: list[FormSection]):
    for sec in sections:
        yield from sec.fields
        yield from iter_fields(sec.subsections)


def _get(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def fill(sections: list[FormSection], config: dict[str, Any]) -> None:
    """Show a config's values (a resolved config has every field)."""
    for f in iter_fields(sections):
        f.value = _get(config, f.path)


BOOL_MARKER = "__bool__"  # hidden input naming every checkbox, so "unchecked" is known


def parse_value(f: FormField, raw: str) -> Any:
    """Browser text -> the schema's type where it parses; otherwise the raw text,
    which the schema then rejects with the field's path."""
    text = raw.strip()
    if text == "" and f.nullable:
        return None
    if f.kind == "integer":
        try:
            return int(text)
        except ValueError:
            return text
    if f.kind == "number":
        try:
            return float(text)
        except ValueError:
            return text
    if f.kind == "array":
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                return text
        return [item.strip() for item in text.split(",") if item.strip()]
    return text


def config_from_post(sections: list[FormSection], data) -> dict[str, Any]:
    """The nested config dict of a submitted form (``data``: a QueryDict)."""
    booleans = set(data.getlist(BOOL_MARKER))
    config: dict[str, Any] = {}
    for f in iter_fields(sections):
        if f.kind == "boolean":
            if f.path not in booleans:
                continue
            value: Any = data.get(f.path) == "on"
        elif f.path in data:
            value = parse_value(f, data.get(f.path, ""))
        else:
            continue
        node = config
        keys = f.path.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return config


def attach_errors(sections: list[FormSection], errors: list[tuple[str, str]]) -> list[str]:
    """Put each config error on its field; return the ones no field claims."""
    by_path = {f.path: f for f in iter_fields(sections)}
    unclaimed = []
    for path, msg in errors:
        target = by_path.get(path.removeprefix("config."))
        if target is not None:
            target.errors.append(msg)
        else:  # an unknown key, a section-level error, the queue, the preset
            unclaimed.append(f"{path}: {msg}")
    return unclaimed


def field_paths(sections: list[FormSection]) -> list[str]:
    return [f.path for f in iter_fields(sections)]
