"""The one query parser (lab.inputs.query): repeated keys, own messages, named fields."""

from __future__ import annotations

import pytest
from django.http import QueryDict
from pydantic import model_validator

from lab.inputs.query import CommaSeparated, OptionalWholeNumber, Query, one_of, parse_query
from trainer.errors import FieldError


class Example(Query):
    ids: CommaSeparated = []
    step: OptionalWholeNumber = None
    band: one_of("minmax", "std") = "minmax"
    start: OptionalWholeNumber = None
    end: OptionalWholeNumber = None

    @model_validator(mode="after")
    def _ordered(self) -> Example:
        if self.start is not None and self.end is not None and self.start > self.end:
            raise FieldError([("start", "start must not be after end")])
        return self


def test_repeated_keys_become_one_list_and_single_keys_take_the_last_value():
    query = parse_query(Example, QueryDict("ids=4&ids=3,2&step=1&step=120.0"))
    assert query.ids == ["4", "3", "2"]
    assert query.step == 120
    assert query.band == "minmax"  # the model's default


def test_a_plain_mapping_parses_too():
    assert parse_query(Example, {"ids": ["1", "2"], "band": "std"}).ids == ["1", "2"]


@pytest.mark.parametrize(
    "query, field, message",
    [
        ("step=many", "step", "step must be an integer"),
        ("step=inf", "step", "step must be an integer"),
        ("band=log", "band", "band must be minmax or std"),
        ("start=9&end=1", "start", "start must not be after end"),
    ],
)
def test_bad_input_is_a_field_error_naming_the_parameter(query, field, message):
    with pytest.raises(FieldError) as caught:
        parse_query(Example, QueryDict(query))
    assert caught.value.as_dict() == {field: [message]}


def test_unknown_parameters_are_ignored():
    assert parse_query(Example, QueryDict("other=1")).ids == []
