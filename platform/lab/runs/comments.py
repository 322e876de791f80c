"""Comments on runs and experiments, and the one rule every comment's body
follows (saved comparisons' comments too, dashboard/review/services.py)."""

from __future__ import annotations

from lab.runs.models import Comment, Run
from lab.text import clean_text
from trainer.errors import FieldError

MAX_COMMENT_CHARS = 10000


def clean_body(body: object) -> str:
    """A comment's body as stored: non-empty, at most 10,000 characters, no control
    characters but tab and newlines (lab.text); a FieldError on ``body``."""
    if not isinstance(body, str) or not body.strip():
        raise FieldError([("body", "a comment cannot be empty")])
    return clean_text("body", body, max_length=MAX_COMMENT_CHARS, multiline=True, label="a comment")


def add_comment(*, author, body: str, run: Run | None = None, experiment=None) -> Comment:
    """Store a comment (``clean_body``) on a run or an experiment."""
    body = clean_body(body)
    if run is None and experiment is None:
        raise FieldError([("run", "comment on a run or an experiment")])
    return Comment.objects.create(author=author, body=body, run=run, experiment=experiment)
