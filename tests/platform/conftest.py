"""Fixtures for the platform tests.

The suite runs on SQLite (default) and on PostgreSQL:

    .venv/bin/python -m pytest tests/platform
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/lab_platform .venv/bin/python -m pytest tests/platform

(pytest-django creates and drops ``test_lab_platform``.)
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from experiments.services import create_experiment
from rest_framework.test import APIClient


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user("alice", password="pw-alice")


@pytest.fixture
def other_user(db):
    return get_user_model().objects.create_user("bob", password="pw-bob")


@pytest.fixture
def staff_user(db):
    return get_user_model().objects.create_user("carol", password="pw-carol", is_staff=True)


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


# A config the real trainer finishes in seconds on a CPU.
TINY_OVERRIDES = {
    "run.steps": 3,
    "run.threads": 1,
    "run.checkpoint_every": 1,
    "warm_start.max_steps": 2,
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 4,
}


@pytest.fixture
def tiny():
    return dict(TINY_OVERRIDES)
