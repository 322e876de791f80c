"""Writes to experiments (sweeps are created by runs.services.create_sweep)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction

from experiments.models import Experiment
from runs.configs import Overrides, resolve_config
from trainer.config import ConfigError


def _check_tags(tags: Sequence[str] | None) -> list[str]:
    tags = list(tags or [])
    if not all(isinstance(t, str) and 0 < len(t) <= 50 for t in tags) or len(tags) > 20:
        raise ConfigError([("tags", "tags are up to 20 strings of 1-50 characters")])
    return tags


@transaction.atomic
def create_experiment(
    *,
    owner,
    name: str,
    description: str = "",
    tags: Sequence[str] | None = None,
    base_config: Mapping[str, Any] | None = None,
    preset: str | None = None,
    overrides: Overrides = None,
) -> Experiment:
    """Create an experiment; its base config is validated and stored fully resolved."""
    name = (name or "").strip()
    if not name:
        raise ConfigError([("name", "an experiment needs a name")])
    if len(name) > 200:
        raise ConfigError([("name", "at most 200 characters")])
    cfg = resolve_config(base_config, preset, overrides)
    return Experiment.objects.create(
        owner=owner,
        name=name,
        description=description or "",
        tags=_check_tags(tags),
        base_config=cfg.to_dict(),
    )
