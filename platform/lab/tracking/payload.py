"""Reading MLflow request bodies: fields checked against MLflow's own limits
(mlflow/utils/validation.py) before anything is stored, each refusal an
INVALID_PARAMETER_VALUE naming the field.

Text the database cannot hold (NUL, a lone surrogate) and keys longer than
the lab's metric-key column are refused too: a key is stored as a
``MetricColumn.key`` (200 characters) once its chunk is sealed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from lab.inputs.json_input import JSONTooDeep, loads
from lab.text import NEVER_STORABLE, forbidden_character
from lab.tracking.errors import invalid

# mlflow/utils/validation.py
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_ENTITIES_PER_BATCH = 1000
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_ENTITY_KEY_LENGTH = 250
MAX_EXPERIMENT_NAME_LENGTH = 500
MAX_RUN_NAME_LENGTH = 200  # Run.variant
# The lab's metric-key column (runs.MetricColumn.key): a longer metric name could
# not be sealed into columns.
MAX_METRIC_KEY_LENGTH = 200
# Steps are stored in 64-bit columns (MetricStep.step, Run.current_step, the
# columns' chunks); the bound is the largest integer a browser's chart (a JavaScript
# number) holds exactly, 2^53 - 1, so a step is drawn where it was logged. MLflow
# allows any int64: a step beyond this is a field error, never a 500.
MAX_STEP = 2**53 - 1
MAX_TIMESTAMP_MS = 2**63 - 1


class Point(NamedTuple):
    key: str
    value: float | None  # None: a non-finite value (stored as the store's null)
    timestamp: int
    step: int
    special: int = 0  # which non-finite value None stands for (tracking.models.NonFinite)


# proto JSON's spellings of the non-finite doubles -> tracking.models.NonFinite
NON_FINITE = {"NaN": 1, "Infinity": 2, "-Infinity": 3}


# A metric key that needs no closer look: printable, no NUL or surrogate.
_PLAIN_KEY = re.compile(rf"[^\x00-\x1f\x7f\ud800-\udfff]{{1,{MAX_METRIC_KEY_LENGTH}}}")


def parse_body(request) -> dict[str, Any]:
    """The JSON object of a POST body (depth-bounded, no NaN literals); a GET's or a
    DELETE's query parameters (a repeated key as a list)."""
    if request.method == "GET" or (request.method == "DELETE" and not request.body):
        return {k: v if len(v) > 1 else v[0] for k, v in request.GET.lists()}
    try:
        text = request.body.decode("utf-8") if request.body else "{}"
        body = loads(text, constant_hint='send a metric\'s NaN as the string "NaN"')
    except JSONTooDeep:
        raise invalid("the request body is nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body


def points(entries: Any, field: str = "metrics") -> list[Point]:
    """The points of a batch, checked. The common shape (a string key, a finite number,
    integer timestamp and step in range) takes the fast path; anything else goes through
    ``point``, which converts what proto JSON allows (int64 as strings, "NaN") or names
    the field that is wrong."""
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise invalid(f"Invalid value for parameter '{field}': must be a list.")
    out: list[Point] = []
    append = out.append
    plain = _PLAIN_KEY.fullmatch
    isfinite = math.isfinite
    for i, e in enumerate(entries):
        if type(e) is dict:
            key, value, ts, step = (
                e.get("key"),
                e.get("value"),
                e.get("timestamp"),
                e.get("step", 0),
            )
            if (
                type(key) is str
                and plain(key) is not None
                and (type(value) is float or type(value) is int)
                and isfinite(value)
                and type(ts) is int
                and 0 <= ts <= MAX_TIMESTAMP_MS
                and type(step) is int
                and 0 <= step <= MAX_STEP
            ):
                append(Point(key, float(value), ts, step))
                continue
        append(point(e, f"{field}[{i}]"))
    return out


def text(
    body: Mapping[str, Any],
    field: str,
    *,
    max_length: int,
    required: bool = True,
    any_text: bool = False,
) -> str:
    """A string field. ``any_text``: a free value (a param's or tag's), where only what no
    column can hold (NUL, a lone surrogate) is refused; otherwise a name, where control
    characters are refused too."""
    value = body.get(field)
    if value is None or value == "":
        if required:
            raise invalid(f"Missing value for required parameter '{field}'.")
        return ""
    if not isinstance(value, str):
        raise invalid(f"Invalid value {value!r} for parameter '{field}': must be a string.")
    if len(value) > max_length:
        raise invalid(
            f"Invalid value for parameter '{field}': {len(value)} characters, "
            f"at most {max_length} are accepted."
        )
    bad = (
        (NEVER_STORABLE.search(value) and "NUL or a lone surrogate")
        if any_text
        else forbidden_character(value, multiline=True)
    )
    if bad:
        raise invalid(f"Invalid value for parameter '{field}': it contains {bad}.")
    return value


def integer(
    body: Mapping[str, Any], field: str, *, default: int | None = None, lo: int = 0, hi: int
) -> int | None:
    """An integer field; proto JSON sends int64 as a number or a decimal string."""
    value = body.get(field)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise invalid(f"Invalid value {value!r} for parameter '{field}': must be an integer.")
    if isinstance(value, str):
        stripped = value.strip()
        digits = stripped[1:] if stripped[:1] == "-" else stripped
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
            raise invalid(f"Invalid value {value!r} for parameter '{field}': must be an integer.")
        value = int(stripped)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise invalid(f"Invalid value {value!r} for parameter '{field}': must be an integer.")
    if not lo <= value <= hi:
        raise invalid(f"Invalid value {value} for parameter '{field}': must be in [{lo}, {hi}].")
    return value


def metric_value(value: Any, field: str) -> float | None:
    """A metric value: a number, or proto JSON's "NaN" / "Infinity" / "-Infinity"
    strings; a non-finite value is stored as null (the store's gap)."""
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise invalid(
                f"Invalid value {value!r} for parameter '{field}': must be a number."
            ) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"Invalid value {value!r} for parameter '{field}': must be a number.")
    value = float(value)
    return value if math.isfinite(value) else None


def entity_key(value: Any, field: str, *, max_length: int = MAX_ENTITY_KEY_LENGTH) -> str:
    return text({field: value}, field, max_length=max_length)


def point(entry: Any, field: str) -> Point:
    if not isinstance(entry, Mapping):
        raise invalid(f"Invalid value for parameter '{field}': must be an object.")
    key = entity_key(entry.get("key"), f"{field}.key", max_length=MAX_METRIC_KEY_LENGTH)
    if "value" not in entry:
        raise invalid(f"Missing value for required parameter '{field}.value'.")
    raw = entry["value"]
    value = metric_value(raw, f"{field}.value")
    timestamp = integer(entry, "timestamp", lo=0, hi=MAX_TIMESTAMP_MS)
    if timestamp is None:
        raise invalid(f"Missing value for required parameter '{field}.timestamp'.")
    step = integer(entry, "step", default=0, lo=0, hi=MAX_STEP)
    return Point(key, value, timestamp, step, _special(raw) if value is None else 0)


def _special(raw: Any) -> int:
    """The NonFinite code of a value stored as None: proto JSON's "NaN" / "Infinity" /
    "-Infinity", or a number that parsed to one."""
    if isinstance(raw, str) and raw in NON_FINITE:
        return NON_FINITE[raw]
    number = float(raw)
    if math.isnan(number):
        return NON_FINITE["NaN"]
    return NON_FINITE["Infinity"] if number > 0 else NON_FINITE["-Infinity"]


def pairs(entries: Any, field: str, *, max_value_length: int) -> list[tuple[str, str]]:
    """``[{"key": k, "value": v}, ...]`` as (key, value) pairs."""
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise invalid(f"Invalid value for parameter '{field}': must be a list.")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise invalid(f"Invalid value for parameter '{field}[{i}]': must be an object.")
        key = entity_key(entry.get("key"), f"{field}[{i}].key")
        value = text(
            {f"{field}[{i}].value": entry.get("value")},
            f"{field}[{i}].value",
            max_length=max_value_length,
            required=False,
            any_text=True,
        )
        out.append((key, value))
    return out


# mlflow/utils/validation.py: dataset inputs
_DATASET_FIELDS = {
    "name": 500,
    "digest": 36,
    "source_type": 36,
    "source": 65535,
    "schema": 1048575,
    "profile": 16777215,
}
MAX_INPUT_TAG_KEY_LENGTH = 255
MAX_INPUT_TAG_VALUE_LENGTH = 500
MAX_INPUTS_PER_REQUEST = 1000


def dataset_inputs(entries: Any) -> list[dict[str, Any]]:
    """LogInputs' ``datasets``: ``[{"dataset": {name, digest, source_type, source,
    schema, profile}, "tags": [{key, value}]}]``, each field checked against MLflow's
    limits; name, digest, source_type and source are required."""
    if entries is None:
        return []
    if not isinstance(entries, list) or len(entries) > MAX_INPUTS_PER_REQUEST:
        raise invalid(
            f"Invalid value for parameter 'datasets': a list of at most {MAX_INPUTS_PER_REQUEST}."
        )
    out = []
    for i, entry in enumerate(entries):
        field = f"datasets[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("dataset"), Mapping):
            raise invalid(f"Invalid value for parameter '{field}': an object with a 'dataset'.")
        raw = entry["dataset"]
        dataset = {}
        for name, most in _DATASET_FIELDS.items():
            required = name in ("name", "digest", "source_type", "source")
            path = f"{field}.dataset.{name}"
            value = text(
                {path: raw.get(name)}, path, max_length=most, required=required, any_text=True
            )
            if value:
                dataset[name] = value
        tags = [
            {"key": k, "value": v}
            for k, v in pairs(
                entry.get("tags"), f"{field}.tags", max_value_length=MAX_INPUT_TAG_VALUE_LENGTH
            )
        ]
        if any(len(t["key"]) > MAX_INPUT_TAG_KEY_LENGTH for t in tags):
            raise invalid(
                f"Invalid value for parameter '{field}.tags': keys up to {MAX_INPUT_TAG_KEY_LENGTH} characters."
            )
        out.append({"tags": tags, "dataset": dataset})
    return out


def model_outputs(entries: Any) -> list[dict[str, Any]]:
    """LogOutputs' ``models``: ``[{"model_id": "m-...", "step": n}]``."""
    if entries is None:
        return []
    if not isinstance(entries, list) or len(entries) > MAX_INPUTS_PER_REQUEST:
        raise invalid(
            f"Invalid value for parameter 'models': a list of at most {MAX_INPUTS_PER_REQUEST}."
        )
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise invalid(f"Invalid value for parameter 'models[{i}]': must be an object.")
        model_id = text(entry, "model_id", max_length=40)
        step = integer(entry, "step", default=0, lo=0, hi=MAX_STEP)
        out.append({"model_id": model_id, "step": step})
    return out
