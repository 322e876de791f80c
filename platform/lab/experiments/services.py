"""Writes to experiments (sweeps are created by runs.sweeps.create_sweep): create,
and whom an experiment is shared with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.contrib.auth.models import Group
from django.db import transaction

from lab.configs import Overrides, resolve_config
from lab.experiments.models import Experiment
from lab.experiments.rights import check_can_share
from lab.text import clean_text
from trainer.errors import FieldError


def _check_tags(tags: Sequence[str] | None) -> list[str]:
    tags = list(tags or [])
    if not all(isinstance(t, str) and 0 < len(t) <= 50 for t in tags) or len(tags) > 20:
        raise FieldError([("tags", "tags are up to 20 strings of 1-50 characters")])
    return [clean_text("tags", t, max_length=50, label="a tag") for t in tags]


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
    if not (name or "").strip():
        raise FieldError([("name", "an experiment needs a name")])
    name = clean_text("name", name, max_length=200)
    description = clean_text("description", description, max_length=20000, multiline=True)
    cfg = resolve_config(base_config, preset, overrides)
    return Experiment.objects.create(
        owner=owner,
        name=name,
        description=description,
        tags=_check_tags(tags),
        base_config=cfg.to_dict(),
    )


MAX_SHARED_GROUPS = 50


def shareable_groups(user):
    """The groups ``user`` may share an experiment with: their own (all for staff)."""
    groups = Group.objects.order_by("name")
    return groups if user.is_staff else groups.filter(user=user)


@transaction.atomic
def set_shared_with(*, user, experiment: Experiment, groups: Sequence[str]) -> Experiment:
    """Share ``experiment`` with exactly ``groups`` (group names; [] shares it with
    nobody). Only the owner or staff may (NotAllowed); a user shares only with
    groups they belong to, staff with any (FieldError ``shared_with``)."""
    check_can_share(user, experiment)
    if isinstance(groups, str) or not isinstance(groups, Sequence):
        raise FieldError([("shared_with", "give a list of group names")])
    names = [clean_text("shared_with", n, max_length=150, label="a group name") for n in groups]
    names = list(dict.fromkeys(n for n in names if n))
    if len(names) > MAX_SHARED_GROUPS:
        raise FieldError([("shared_with", f"at most {MAX_SHARED_GROUPS} groups")])
    allowed = {g.name: g for g in shareable_groups(user).filter(name__in=names)}
    refused = [n for n in names if n not in allowed]
    if refused:
        raise FieldError(
            [
                (
                    "shared_with",
                    f"you can share only with groups you belong to; not: {', '.join(refused)}",
                )
            ]
        )
    experiment.shared_with.set([allowed[n] for n in names])
    return experiment
