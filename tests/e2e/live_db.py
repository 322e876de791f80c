"""Writes to the live server's database from a browser test while a page polls it."""

from __future__ import annotations

import time

from browser_harness import ceiling_s
from django.db import OperationalError

from lab.runs.models import Run


def update_while_polled(run_id: int, **fields) -> None:
    """Write a run the open page is polling. The live server's in-memory SQLite
    shares its cache between threads, where a write that meets a read answers
    "database table is locked" at once instead of waiting: retry until the write
    lands (the page's poll is short; the ceiling only catches a lock never freed)."""
    deadline = time.monotonic() + ceiling_s(30)
    while True:
        try:
            Run.objects.filter(pk=run_id).update(**fields)
            return
        except OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
