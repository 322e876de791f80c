"""Web requests survive a dropped database connection: a live server (the
production WSGI server `make up` starts) on PostgreSQL answers a poll, every
backend of its database is terminated (``pg_terminate_backend``: a restart, a
failover, an idle-connection reaper), and the poll goes on without a single
500 (settings: ``CONN_MAX_AGE`` with ``CONN_HEALTH_CHECKS``)."""

from __future__ import annotations

import pytest
from lab_processes import PG_ADMIN_URL, LabStack, pg_up

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

POLLED = ["/api/runs", "/api/queue", "/api/experiments", "/api/health"]


def _terminate_backends(database: str) -> int:
    import psycopg

    with psycopg.connect(
        PG_ADMIN_URL.replace("postgres://", "postgresql://"), autocommit=True
    ) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [database],
        ).fetchall()
    return len(rows)


@pytest.fixture
def pg_stack(tmp_path, monkeypatch):
    if not pg_up():
        pytest.skip(f"no PostgreSQL at {PG_ADMIN_URL}")
    # LabStack makes a fresh PostgreSQL database when the suite's DATABASE_URL is one.
    monkeypatch.setenv("DATABASE_URL", PG_ADMIN_URL)
    monkeypatch.setenv("DJANGO_SECRET_KEY", "test-only-secret-key")
    stack = LabStack(tmp_path, "filesystem")
    try:
        yield stack
    finally:
        stack.close()


def _poll(stack, rounds: int) -> list[tuple[str, int, dict]]:
    return [(path, *stack.request("GET", path)) for _ in range(rounds) for path in POLLED]


def _failures(responses: list[tuple[str, int, dict]]) -> list[tuple[str, int]]:
    """Anything but a 200, except /api/health's 503 for the reconciler this stack
    does not start (its database part must still say ok)."""
    bad = []
    for path, code, body in responses:
        if path == "/api/health" and code == 503 and body.get("db", {}).get("ok"):
            continue
        if code != 200:
            bad.append((path, code))
    return bad


def test_a_poll_survives_the_database_dropping_every_connection(pg_stack):
    stack = pg_stack
    # Every web thread (2 workers x 4 threads) gets to hold a kept connection.
    assert not _failures(_poll(stack, 8))
    for _ in range(3):
        assert _terminate_backends(stack.pg_db) >= 1  # the web threads' kept connections
        errors = _failures(_poll(stack, 6))
        assert not errors, (errors, stack.log("web"))
