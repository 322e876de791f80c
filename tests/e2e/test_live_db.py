"""The browser tests' retry of writes that meet the live server's reads (live_db.py)."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError
from django.db import OperationalError
from live_db import retry_while_locked


def _failing(times: int, error: Exception):
    calls = []

    def action():
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "done"

    return action, calls


def test_a_flush_that_meets_a_read_is_tried_again():
    # flush wraps the table lock in a CommandError that names only the database
    locked = CommandError("Database file:memorydb_default couldn't be flushed.")
    locked.__cause__ = OperationalError("database table is locked: auth_user")
    action, calls = _failing(2, locked)
    assert retry_while_locked(action) == "done"
    assert len(calls) == 3


def test_a_locked_write_is_tried_again():
    action, calls = _failing(1, OperationalError("database table is locked: runs_run"))
    assert retry_while_locked(action) == "done" and len(calls) == 2


def test_any_other_error_is_raised_at_once():
    action, calls = _failing(1, OperationalError("no such table: runs_run"))
    with pytest.raises(OperationalError, match="no such table"):
        retry_while_locked(action)
    assert len(calls) == 1
