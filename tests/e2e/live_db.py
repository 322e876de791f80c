"""Writes to the live server's database from a browser test while a page polls it.

The live server's in-memory SQLite shares its cache between threads, where a write
that meets a read answers "database table is locked" at once instead of waiting
(SQLite's busy timeout does not apply to a shared cache's table locks)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from browser_harness import ceiling_s
from django.core.management.base import CommandError
from django.db import OperationalError

from lab.runs.models import Run

T = TypeVar("T")


def retry_while_locked(action: Callable[[], T]) -> T:
    """``action()``, again while it fails on a table another thread reads (the page's
    poll is short; the ceiling only catches a lock never freed). Any other error, or
    a lock past the ceiling, is raised."""
    deadline = time.monotonic() + ceiling_s(30)
    while True:
        try:
            return action()
        except (CommandError, OperationalError) as exc:
            # flush's CommandError names the database, not the error it wraps
            if "locked" not in f"{exc} {exc.__cause__}" or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def update_while_polled(run_id: int, **fields) -> None:
    """Write a run the open page is polling."""
    retry_while_locked(lambda: Run.objects.filter(pk=run_id).update(**fields))
