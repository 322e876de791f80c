"""Fixtures shared by the platform, dashboard and browser tests: the team's users.

Also suite-wide settings: a fast password hasher (the production PBKDF2
costs ~0.3 s per user created, which fixtures pay hundreds of times), no
PostgreSQL idle-transaction timeout for the test process itself (a database
test is one transaction, idle while it trains a model in-process), and a
closing list of tests that took over ``SLOW_TEST_S`` seconds without the
``slow`` mark, so the mark stays honest; and no background warm-up of the
review's imports (``LAB_WARM_IMPORTS=0``).
"""

import os
from pathlib import Path

import pytest

# The web process's background import of the review's statistics
# (dashboard/web/warmup.py) would cost every test process its CPU.
os.environ.setdefault("LAB_WARM_IMPORTS", "0")

SLOW_TEST_S = 5.0
TRAINER_LOG_LINES = 40  # of each trainer.log a failed lab-stack test shows
_unmarked_slow: list[tuple[str, float]] = []


def pytest_configure(config):
    from django.conf import settings

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.DATABASES["default"].get("OPTIONS", {}).pop("options", None)


def pytest_runtest_logreport(report):
    if report.when == "call" and report.duration > SLOW_TEST_S and "slow" not in report.keywords:
        _unmarked_slow.append((report.nodeid, report.duration))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that ran a lab stack shows the end of its trainers' logs: a run
    that failed on a worker says why only there (the report names the file, which a
    CI machine does not keep)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed or report.when == "teardown":
        return
    for value in getattr(item, "funcargs", {}).values():
        if type(value).__name__ != "LabStack":
            continue
        for log in sorted(Path(value.env["LAB_RUNS_DIR"]).rglob("trainer.log"))[:8]:
            tail = log.read_text(errors="replace").splitlines()[-TRAINER_LOG_LINES:]
            report.sections.append((f"end of {log}", "\n".join(tail)))


def pytest_terminal_summary(terminalreporter):
    if _unmarked_slow:
        terminalreporter.section(f"tests over {SLOW_TEST_S:.0f} s without the slow mark")
        for nodeid, seconds in sorted(_unmarked_slow, key=lambda item: -item[1]):
            terminalreporter.line(f"{seconds:6.1f} s  {nodeid}")


@pytest.fixture
def user(db):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("alice", password="pw-alice")


@pytest.fixture
def other_user(db):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("bob", password="pw-bob")


@pytest.fixture
def staff_user(db):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("carol", password="pw-carol", is_staff=True)
