"""Every float of the config is finite: inf and NaN never reach a stored config."""

from __future__ import annotations

import math

import pytest

from trainer.config import apply_overrides
from trainer.errors import FieldError
from trainer.validation import validate_config


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_float_is_a_field_error(value):
    with pytest.raises(FieldError) as exc:
        validate_config({"optim": {"grad_clip": value}})
    assert list(exc.value.as_dict()) == ["optim.grad_clip"]


@pytest.mark.parametrize("raw", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_overrides_that_parse_to_inf_name_the_field(raw):
    data = apply_overrides({}, [f"stabilizers.is_correction.tis_cap={raw}"])
    with pytest.raises(FieldError) as exc:
        validate_config(data)
    assert list(exc.value.as_dict()) == ["stabilizers.is_correction.tis_cap"]


def test_finite_floats_still_pass():
    assert validate_config({"optim": {"lr": 1e-3}}).optim.lr == 1e-3
