"""The base of every config section, and the warning an old config path gives."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigDeprecationWarning(FutureWarning):
    """A config used a path of the previous release; the message names the new one.

    A FutureWarning so Python shows it by default: it is meant for the person
    who wrote the config, not only for developers.
    """


class Section(BaseModel):
    """Base for every config section: strict types, no unknown keys."""

    model_config = ConfigDict(
        extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False
    )
