"""Every write of the team review (pages call these; one transaction each).

Who may do what: anyone logged in views, comments, gives verdicts, saves
comparisons and pins a baseline; only a saved comparison's owner or staff
deletes it, and only a verdict's author or staff withdraws it.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction

from dashboard.models import (
    BaselinePin,
    ComparisonComment,
    SavedComparison,
    Verdict,
    VerdictLabel,
)
from experiments.models import Experiment
from runs import services as run_services
from runs.models import Comment, Run
from trainer.config import ConfigError

MAX_COMMENT_CHARS = 10000
MAX_COMPARED_RUNS = 100


class NotAllowed(Exception):
    """The user may view this but not change it."""


def _clean_body(body: str) -> str:
    body = (body or "").strip()
    if not body:
        raise ConfigError([("body", "a comment cannot be empty")])
    if len(body) > MAX_COMMENT_CHARS:
        raise ConfigError([("body", f"a comment holds at most {MAX_COMMENT_CHARS} characters")])
    return body


def comment_on_run(*, author, run: Run, body: str) -> Comment:
    """A comment on a run (stored as the platform's runs.Comment)."""
    return run_services.add_comment(author=author, body=body, run=run)


def comment_on_comparison(*, author, comparison: SavedComparison, body: str) -> ComparisonComment:
    return ComparisonComment.objects.create(
        comparison=comparison, author=author, body=_clean_body(body)
    )


def set_verdict(*, author, run: Run, label: str, note: str = "") -> Verdict:
    """Record a verdict; the latest one is the run's verdict."""
    if label not in VerdictLabel.values:
        choices = ", ".join(VerdictLabel.values)
        raise ConfigError([("label", f"unknown verdict '{label}'; choose one of: {choices}")])
    note = (note or "").strip()
    if len(note) > 500:
        raise ConfigError([("note", "a verdict note holds at most 500 characters")])
    return Verdict.objects.create(run=run, label=label, author=author, note=note)


def withdraw_verdict(*, user, verdict: Verdict) -> None:
    if not (user.is_staff or user.pk == verdict.author_id):
        raise NotAllowed("only the verdict's author or staff can withdraw it")
    verdict.delete()


@transaction.atomic
def save_comparison(
    *, owner, name: str, run_ids: Sequence[int], baseline_id: int | None = None
) -> SavedComparison:
    """Store a named comparison of existing runs; the baseline must be one of them."""
    name = (name or "").strip()
    errors = []
    if not name:
        errors.append(("name", "a saved comparison needs a name"))
    elif len(name) > 200:
        errors.append(("name", "at most 200 characters"))
    ids = list(dict.fromkeys(int(r) for r in run_ids))
    if not ids:
        errors.append(("runs", "choose at least one run"))
    elif len(ids) > MAX_COMPARED_RUNS:
        errors.append(("runs", f"a comparison holds at most {MAX_COMPARED_RUNS} runs"))
    else:
        found = set(Run.objects.filter(pk__in=ids).values_list("pk", flat=True))
        missing = [i for i in ids if i not in found]
        if missing:
            errors.append(("runs", f"no such runs: {', '.join(map(str, missing))}"))
    if baseline_id is not None and baseline_id not in ids:
        errors.append(("baseline", "the baseline must be one of the compared runs"))
    if errors:
        raise ConfigError(errors)
    return SavedComparison.objects.create(
        name=name, owner=owner, run_ids=ids, baseline_id=baseline_id
    )


def delete_comparison(*, user, comparison: SavedComparison) -> None:
    if not comparison.can_manage(user):
        raise NotAllowed("only the comparison's owner or staff can delete it")
    comparison.delete()


@transaction.atomic
def pin_baseline(*, user, run: Run) -> BaselinePin:
    """Make ``run`` the baseline its experiment's charts are drawn against."""
    pin, _ = BaselinePin.objects.update_or_create(
        experiment_id=run.experiment_id, defaults={"run": run, "pinned_by": user}
    )
    return pin


def unpin_baseline(*, user, experiment: Experiment) -> None:
    BaselinePin.objects.filter(experiment=experiment).delete()
