"""Every write of the team review (pages call these; one transaction each):
verdicts, saved comparisons, pinned baselines and comments. A comment's body
follows one rule, ``lab.runs.comments.clean_body``, wherever it is stored.

Who may do what (lab.experiments.rights, the table in docs/platform.md):
anyone logged in views, comments and saves comparisons; an experiment's owner,
the groups it is shared with and staff give verdicts on its runs and pin or
unpin its baseline; only a saved comparison's owner or staff deletes it, and
only a verdict's author or staff withdraws it.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction

from dashboard.review.models import (
    BaselinePin,
    ComparisonComment,
    SavedComparison,
    Verdict,
    VerdictLabel,
)
from lab.experiments.models import Experiment
from lab.experiments.rights import NotAllowed, check_can_give_verdict, check_can_pin
from lab.runs import comments
from lab.runs.models import Comment, Run
from lab.text import clean_text
from trainer.errors import FieldError

MAX_COMPARED_RUNS = 100


def comment_on_run(*, author, run: Run, body: str) -> Comment:
    """A comment on a run (stored as the platform's runs.Comment)."""
    return comments.add_comment(author=author, body=body, run=run)


def comment_on_experiment(*, author, experiment: Experiment, body: str) -> Comment:
    """A comment on an experiment (stored as the platform's runs.Comment)."""
    return comments.add_comment(author=author, body=body, experiment=experiment)


def comment_on_comparison(*, author, comparison: SavedComparison, body: str) -> ComparisonComment:
    return ComparisonComment.objects.create(
        comparison=comparison, author=author, body=comments.clean_body(body)
    )


def set_verdict(*, author, run: Run, label: str, note: str = "") -> Verdict:
    """Record a verdict; the latest one is the run's verdict. Only the experiment's
    members and staff judge its runs (NotAllowed)."""
    check_can_give_verdict(author, run.experiment)
    if label not in VerdictLabel.values:
        choices = ", ".join(VerdictLabel.values)
        raise FieldError([("label", f"unknown verdict '{label}'; choose one of: {choices}")])
    note = clean_text("note", note, max_length=500, multiline=True, label="a verdict note")
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
    name = (name or "").strip() if isinstance(name, str) else ""
    errors = []
    if not name:
        errors.append(("name", "a saved comparison needs a name"))
    else:
        try:
            name = clean_text("name", name, max_length=200)
        except FieldError as exc:
            errors.extend(exc.errors)
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
        raise FieldError(errors)
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
    check_can_pin(user, run.experiment)
    pin, _ = BaselinePin.objects.update_or_create(
        experiment_id=run.experiment_id, defaults={"run": run, "pinned_by": user}
    )
    return pin


def unpin_baseline(*, user, experiment: Experiment) -> None:
    check_can_pin(user, experiment)
    BaselinePin.objects.filter(experiment=experiment).delete()
