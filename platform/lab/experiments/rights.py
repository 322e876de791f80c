"""Who may change what in an experiment (the table in docs/platform.md, "Rights").

Anyone logged in views everything and comments. An experiment's *members* are
its owner and the users of the groups it is shared with (``shared_with``);
members and staff may queue runs and sweeps into it, pin or unpin its baseline
and give verdicts on its runs. Only the owner or staff changes whom it is
shared with. A run is cancelled or deleted by its own owner or staff
(``Run.can_manage``); a verdict is withdrawn by its author or staff. A priority
above ``LAB_MAX_USER_PRIORITY`` needs staff.
"""

from __future__ import annotations

from django.conf import settings

from lab.experiments.models import Experiment
from trainer.errors import FieldError


class NotAllowed(Exception):
    """The user may view this but not change it (answered 403 / an inline error)."""


def _logged_in(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)


def is_member(user, experiment: Experiment) -> bool:
    """The owner, or a user in one of the groups the experiment is shared with."""
    if not _logged_in(user):
        return False
    if user.pk == experiment.owner_id:
        return True
    return experiment.shared_with.filter(user=user).exists()


def can_queue(user, experiment: Experiment) -> bool:
    """Queue runs and sweeps (and clones) into ``experiment``: members and staff."""
    return _logged_in(user) and (user.is_staff or is_member(user, experiment))


# Pinning the baseline and giving verdicts are the same right: the people who
# run the study judge it; everyone else comments.
can_pin = can_queue
can_give_verdict = can_queue


def can_share(user, experiment: Experiment) -> bool:
    """Change whom ``experiment`` is shared with: its owner and staff."""
    return _logged_in(user) and (user.is_staff or user.pk == experiment.owner_id)


def check_can_queue(user, experiment: Experiment) -> None:
    if not can_queue(user, experiment):
        raise NotAllowed(
            f"only the owner of experiment {experiment.pk}, the groups it is shared with "
            "and staff can queue runs in it"
        )


def check_can_pin(user, experiment: Experiment) -> None:
    if not can_pin(user, experiment):
        raise NotAllowed(
            "only the experiment's owner, the groups it is shared with and staff "
            "can pin or unpin its baseline"
        )


def check_can_give_verdict(user, experiment: Experiment) -> None:
    if not can_give_verdict(user, experiment):
        raise NotAllowed(
            "only the experiment's owner, the groups it is shared with and staff "
            "give verdicts on its runs; comment instead"
        )


def check_can_share(user, experiment: Experiment) -> None:
    if not can_share(user, experiment):
        raise NotAllowed("only the experiment's owner or staff can change whom it is shared with")


def max_priority(user) -> int:
    """The highest priority ``user`` may give a run: 9 for staff, else the setting."""
    return 9 if _logged_in(user) and user.is_staff else settings.LAB_MAX_USER_PRIORITY


def check_priority_allowed(user, priority: int) -> None:
    """FieldError on ``priority`` when it is above what ``user`` may give."""
    allowed = max_priority(user)
    if priority > allowed:
        raise FieldError(
            [
                (
                    "priority",
                    f"priority {priority} needs staff; this deployment lets users queue "
                    f"at most {allowed} (LAB_MAX_USER_PRIORITY)",
                )
            ]
        )
