"""Comments on runs and experiments."""

from __future__ import annotations

from lab.experiments.text import clean_text
from lab.runs.models import Comment, Run
from trainer.errors import FieldError


def add_comment(*, author, body: str, run: Run | None = None, experiment=None) -> Comment:
    """Store a non-empty comment (at most 10,000 characters) on a run or an experiment."""
    if not isinstance(body, str) or not body.strip():
        raise FieldError([("body", "a comment cannot be empty")])
    body = clean_text("body", body, max_length=10000, multiline=True, label="a comment")
    if run is None and experiment is None:
        raise FieldError([("run", "comment on a run or an experiment")])
    return Comment.objects.create(author=author, body=body, run=run, experiment=experiment)
