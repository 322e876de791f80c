"""The new-run form, generated from the config's JSON Schema (trainer.config).

Every field of the ONE schema becomes an input with its default, help text and
bounds; sections follow the schema (model, task, rollout, ...), nested objects
become sub-sections. A tagged union (``task``: one model per ``task.name``)
becomes a select of the kinds, the fields every kind shares, and one
sub-section per kind whose fields are sent only when that kind is selected. Values the browser sends are converted to the schema's
types where they parse; anything that does not parse is passed through as
typed, so the schema itself reports the error at the field's path.

For people rather than for the schema: the preset's key fields (``KEY_FIELDS``:
model shape, algorithm, stabilizers, steps, seed) come first in their own
section; every other section is collapsed with a count of the fields that
differ from the reference config (the preset, the cloned run, or the
experiment's base), and ``changes`` lists those differences for the page's
"changes from the preset" panel.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from lab.inputs import json_input
from trainer.config import json_schema


@dataclass
class FormField:
    path: str  # dotted config path, also the input's name
    label: str
    kind: str  # integer | number | boolean | enum | array | object | string
    help: str
    default: Any
    nullable: bool = False
    choices: list[Any] = field(default_factory=list)
    minimum: float | None = None
    maximum: float | None = None
    value: Any = None
    errors: list[str] = field(default_factory=list)
    # (tag path, kind): the field belongs to one kind of a tagged union.
    when: tuple[str, str] | None = None
    # The value in the reference config (preset, cloned run or experiment base).
    reference: Any = None

    @property
    def input_value(self) -> str:
        """The value as the input shows it."""
        return _as_text(self.kind, self.value)

    @property
    def reference_value(self) -> str:
        """The reference config's value, as the input would show it."""
        return _as_text(self.kind, self.reference)

    @property
    def changed(self) -> bool:
        """The shown value differs from the reference (compared as the input shows both,
        so 0.1 typed as "0.10" is a change only if it parses to another number)."""
        if self.kind == "boolean":
            return bool(self.value) != bool(self.reference)
        if self.kind in ("integer", "number"):
            try:
                return float(self.input_value) != float(self.reference_value)
            except ValueError:
                pass
        return self.input_value != self.reference_value

    @property
    def bounds(self) -> str:
        parts = []
        if self.minimum is not None:
            parts.append(f"min {self.minimum:g}")
        if self.maximum is not None:
            parts.append(f"max {self.maximum:g}")
        return ", ".join(parts)


def _as_text(kind: str, value: Any) -> str:
    if value is None:
        return ""
    if kind == "array":
        return ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)
    if kind == "object":  # a mapping (model.chat_template_kwargs) is typed as JSON
        return json.dumps(value) if isinstance(value, dict) and value else ""
    return str(value)


# The preset's key fields, shown first: model shape, algorithm, stabilizers, length, seed.
KEY_FIELDS: tuple[str, ...] = (
    "model.n_layers",
    "model.d_model",
    "model.n_experts",
    "model.top_k",
    "algorithm.name",
    "stabilizers.replay.mode",
    "stabilizers.is_correction.kind",
    "stabilizers.balance.aux_loss_coef",
    "stabilizers.surgery.enabled",
    "run.steps",
    "run.seed",
)
KEY_SECTION = "key"


@dataclass
class FormSection:
    path: str
    title: str
    fields: list[FormField] = field(default_factory=list)
    subsections: list[FormSection] = field(default_factory=list)

    def all_fields(self):
        yield from self.fields
        for sub in self.subsections:
            yield from sub.all_fields()

    @property
    def changed_count(self) -> int:
        """Fields of this section (sub-sections included) that differ from the reference."""
        return sum(1 for f in self.all_fields() if f.changed)

    @property
    def has_errors(self) -> bool:
        return any(f.errors for f in self.all_fields())


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


def _title(path: str) -> str:
    return path.rsplit(".", 1)[-1].replace("_", " ")


def _union_section(path: str, node: dict[str, Any], defs: dict[str, Any]) -> FormSection:
    """A tagged union: the tag as a select, shared fields, one sub-section per kind."""
    tag = node["discriminator"]["propertyName"]
    kinds = {
        k: _resolve({"$ref": ref}, defs) for k, ref in node["discriminator"]["mapping"].items()
    }
    tag_path = f"{path}.{tag}"
    out = FormSection(path=path, title=_title(path))
    out.fields.append(
        FormField(
            path=tag_path,
            label=tag,
            kind="enum",
            help="; ".join(v["properties"][tag].get("description", k) for k, v in kinds.items()),
            default=next(iter(kinds)),
            choices=list(kinds),
        )
    )
    shared = set.intersection(*(set(v["properties"]) for v in kinds.values())) - {tag}
    first = next(iter(kinds.values()))
    out.fields += [
        _field(f"{path}.{name}", prop)
        for name, prop in first["properties"].items()
        if name in shared
    ]
    for kind, spec in kinds.items():
        sub = FormSection(path=f"{path}.{kind}", title=f"{kind} (when {tag} = {kind})")
        for name, prop in spec["properties"].items():
            if name != tag and name not in shared:
                f = _field(f"{path}.{name}", prop)
                f.when = (tag_path, kind)
                sub.fields.append(f)
        out.subsections.append(sub)
    return out


def build_sections(schema: dict[str, Any] | None = None) -> list[FormSection]:
    schema = schema or json_schema()
    defs = schema.get("$defs", {})

    def section(path: str, node: dict[str, Any]) -> FormSection:
        if "discriminator" in node:
            return _union_section(path, node, defs)
        node = _resolve(node, defs)
        out = FormSection(path=path, title=_title(path))
        for name, prop in node.get("properties", {}).items():
            child = f"{path}.{name}"
            resolved = _resolve(prop, defs)
            if "discriminator" in prop or (
                resolved.get("type") == "object" and "properties" in resolved
            ):
                out.subsections.append(section(child, prop))
            else:
                out.fields.append(_field(child, prop))
        return out

    return [section(name, prop) for name, prop in schema["properties"].items()]


def with_key_section(sections: list[FormSection]) -> list[FormSection]:
    """``sections`` with the KEY_FIELDS moved out of them into a first section,
    labelled by their dotted path: out of their section, "mode" or "enabled"
    alone would not say which ("stabilizers.replay.mode")."""
    by_path = {f.path: f for f in iter_fields(sections)}
    key = FormSection(path=KEY_SECTION, title="Key settings")
    key.fields = [replace(by_path[p], label=p) for p in KEY_FIELDS if p in by_path]
    moved = {f.path for f in key.fields}

    def prune(section: FormSection) -> None:
        section.fields = [f for f in section.fields if f.path not in moved]
        for sub in section.subsections:
            prune(sub)

    for section in sections:
        prune(section)
    return [key, *sections]


def set_reference(sections: list[FormSection], config: dict[str, Any]) -> None:
    """Record the reference config's value on every field (for the change counts)."""
    for f in iter_fields(sections):
        value = _get(config, f.path)
        f.reference = f.default if value is _MISSING else value


def changes(sections: list[FormSection]) -> list[FormField]:
    """The fields whose shown value differs from the reference, in form order."""
    return [f for f in iter_fields(sections) if f.changed and not _hidden_union_field(sections, f)]


def _hidden_union_field(sections: list[FormSection], f: FormField) -> bool:
    """A field of a tagged union's kind that is not the selected one (never sent)."""
    if f.when is None:
        return False
    tag = next((t for t in iter_fields(sections) if t.path == f.when[0]), None)
    return tag is not None and str(tag.value) != f.when[1]


def error_fields(sections: list[FormSection]) -> list[FormField]:
    """Fields with errors, in form order (the page's error summary)."""
    return [f for f in iter_fields(sections) if f.errors]


def iter_fields(sections: list[FormSection]):
    for sec in sections:
        yield from sec.fields
        yield from iter_fields(sec.subsections)


_MISSING = object()


def _get(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
    return node


def fill(sections: list[FormSection], config: dict[str, Any]) -> None:
    """Show a config's values (a resolved config has every field of its task kind;
    the other kinds' fields show their defaults)."""
    for f in iter_fields(sections):
        value = _get(config, f.path)
        f.value = f.default if value is _MISSING else value


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
                return json_input.loads(text)  # depth-bounded: no RecursionError
            except ValueError:
                return text
        return [item.strip() for item in text.split(",") if item.strip()]
    if f.kind == "object":
        if text == "":
            return {}
        try:
            return json_input.loads(text)  # depth-bounded: no RecursionError
        except ValueError:
            return text
    return text


def config_from_post(sections: list[FormSection], data) -> dict[str, Any]:
    """The nested config dict of a submitted form (``data``: a QueryDict)."""
    booleans = set(data.getlist(BOOL_MARKER))
    config: dict[str, Any] = {}
    for f in iter_fields(sections):
        if f.when is not None and data.get(f.when[0]) != f.when[1]:
            continue  # a field of a union kind that is not selected
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
