"""Fixtures for the platform tests.

The suite runs on SQLite (default) and on PostgreSQL:

    .venv/bin/python -m pytest tests/platform
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/lab_platform .venv/bin/python -m pytest tests/platform

(pytest-django creates and drops ``test_lab_platform``.)
"""

from __future__ import annotations

import pytest
from lab_processes import REDIS_URL, TINY_OVERRIDES, LabStack, redis_ok
from rest_framework.test import APIClient

from lab.experiments.services import create_experiment


@pytest.fixture
def api(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def other_api(other_user):
    client = APIClient()
    client.force_authenticate(other_user)
    return client


@pytest.fixture
def experiment(user):
    return create_experiment(owner=user, name="replay vs none", preset="moe-grpo")


@pytest.fixture
def tiny():
    return dict(TINY_OVERRIDES)


@pytest.fixture(params=["redis", "filesystem"])
def lab_stack(request, tmp_path):
    if request.param == "redis" and not redis_ok():
        pytest.skip(f"no Redis at {REDIS_URL}")
    stack = LabStack(tmp_path, request.param)
    try:
        yield stack
    finally:
        stack.close()
