"""Fixtures shared by the platform, dashboard and browser tests: the team's users."""

import pytest


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
