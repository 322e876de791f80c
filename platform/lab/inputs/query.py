"""One parser for query strings: ``request.GET`` -> a pydantic model per endpoint.

Every view that reads query parameters (the API's and the dashboard's) declares
what it accepts as a ``Query`` model and calls ``parse_query``. A field typed as
a list takes every value of a repeated key (``?runs=4&runs=3`` -> ``["4", "3"]``);
any other field takes the last value, as ``QueryDict.get`` does. Bad input
raises ``trainer.errors.FieldError`` naming the parameter, which the API turns
into 400 JSON and the pages into a 400 or an inline error.

Validators give their own messages: a ``ValueError("layer must be ...")`` raised
in a field validator reaches the user as that text, and a ``FieldError`` raised
in a model validator keeps the field it names (e.g. ``start`` of a window).
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo

from trainer.errors import FieldError

Q = TypeVar("Q", bound="Query")


class Query(BaseModel):
    """Base of every endpoint's query model: unknown parameters are ignored (a page
    link may carry another view's), parsed values are read-only."""

    model_config = ConfigDict(extra="ignore", frozen=True)


def parse_query(model: type[Q], query: Mapping[str, Any]) -> Q:
    """``query`` (a ``QueryDict`` or a plain mapping) as ``model``; raises ``FieldError``."""
    data: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in query:
            continue
        values = _all_values(query, key)
        data[name] = values if _takes_a_list(field.annotation) else values[-1]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise FieldError(_field_errors(exc)) from None


def _all_values(query: Mapping[str, Any], key: str) -> list[Any]:
    if hasattr(query, "getlist"):
        return list(query.getlist(key))
    value = query[key]
    return list(value) if isinstance(value, list | tuple) else [value]


def _takes_a_list(annotation: Any) -> bool:
    """``list[...]``, ``list[...] | None`` or an ``Annotated`` list."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _takes_a_list(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return any(_takes_a_list(arg) for arg in get_args(annotation) if arg is not type(None))
    return origin in (list, Sequence, tuple)


def _field_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """Pydantic's errors as ``(parameter, message)``; a validator's own text is kept."""
    out: list[tuple[str, str]] = []
    for error in exc.errors():
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            out.extend(cause.errors)
            continue
        name = str(error["loc"][0]) if error["loc"] else ""
        message = str(cause) if error["type"] == "value_error" and cause else error["msg"]
        out.append((name, message))
    return out


# --------------------------------------------------------------------------- shared field types
# Larger than any step, id or point count; keeps every parsed number inside a
# 64-bit database integer and numpy's int64.
MAX_WHOLE_NUMBER = 10**15


def _optional_whole_number(value: Any, info: ValidationInfo) -> int | None:
    """'' -> None; '120' or '120.0' -> 120 (a chart sends steps as numbers).

    ``inf``, ``nan`` and numbers beyond ``MAX_WHOLE_NUMBER`` are refused."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not math.isfinite(number) or abs(number) > MAX_WHOLE_NUMBER:
        raise ValueError(f"{info.field_name} must be an integer") from None
    return int(number)


def ascii_id(value: Any) -> int | None:
    """An id typed as ASCII digits (at most 18, inside a 64-bit integer), else None.

    ``"²".isdigit()`` is True but ``int("²")`` raises, so ``str.isdigit`` is never
    the test for an id."""
    text = str(value).strip()
    return int(text) if ID_TEXT.fullmatch(text) else None


ID_TEXT = re.compile(r"[0-9]{1,18}")


OptionalWholeNumber = Annotated[int | None, BeforeValidator(_optional_whole_number)]


def comma_separated(value: Any) -> list[str]:
    """``"a,b"`` or ``["a,b", "c"]`` -> ``["a", "b", "c"]`` (blanks dropped)."""
    chunks = value if isinstance(value, list | tuple) else [value]
    return [part.strip() for chunk in chunks for part in str(chunk).split(",") if part.strip()]


CommaSeparated = Annotated[list[str], BeforeValidator(comma_separated)]


def one_of(*choices: str) -> Any:
    """A text parameter that must be one of ``choices`` (the model gives the default)."""

    def check(value: Any, info: ValidationInfo) -> str:
        if value not in choices:
            raise ValueError(f"{info.field_name} must be {' or '.join(choices)}")
        return value

    return Annotated[str, BeforeValidator(check)]
