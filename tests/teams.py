"""Test helper: put users in a team (a Django group) the experiment is shared with."""

from __future__ import annotations

from django.contrib.auth.models import Group


def share(experiment, *users, group: str = "team") -> Group:
    """Share ``experiment`` with ``group`` and make ``users`` its members."""
    team, _ = Group.objects.get_or_create(name=group)
    for user in users:
        user.groups.add(team)
    experiment.shared_with.add(team)
    return team
