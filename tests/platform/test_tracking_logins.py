"""An MLflow client's login (HTTP basic) is checked by the password hasher once, then
remembered for a few minutes, and only while it stays valid: a changed password, a
deactivated user, a wrong password or an expired entry is checked again."""

from __future__ import annotations

import base64

import pytest
from mlflow_rest import Mlflow

from lab.tracking import auth


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


@pytest.fixture
def checks(monkeypatch):
    """The password checks made (calls of django's authenticate), with a fresh memory."""
    calls: list[str] = []
    real = auth.authenticate

    def counted(request, username, password):
        calls.append(username)
        return real(request, username=username, password=password)

    monkeypatch.setattr(auth, "authenticate", counted)
    monkeypatch.setattr(auth, "VERIFIED_LOGINS", auth.VerifiedLogins())
    return calls


def _status(ml: Mlflow, auth_header: str) -> int:
    return ml.call("GET", "experiments/search", {"max_results": 1}, auth=auth_header)[0]


@pytest.mark.django_db
def test_a_login_is_checked_once_then_remembered(user, checks):
    ml = Mlflow(user)
    for _ in range(3):
        assert _status(ml, _basic("alice", "pw-alice")) == 200
    assert checks == ["alice"]


@pytest.mark.django_db
def test_a_wrong_password_is_checked_every_time_and_never_remembered(user, checks):
    ml = Mlflow(user)
    assert _status(ml, _basic("alice", "pw-alice")) == 200
    for _ in range(2):
        assert _status(ml, _basic("alice", "wrong")) == 401
    assert checks == ["alice", "alice", "alice"]


@pytest.mark.django_db
def test_a_changed_password_or_a_deactivated_user_ends_the_memory(user, checks):
    ml = Mlflow(user)
    assert _status(ml, _basic("alice", "pw-alice")) == 200
    user.set_password("new-secret")
    user.save()
    assert _status(ml, _basic("alice", "pw-alice")) == 401
    assert _status(ml, _basic("alice", "new-secret")) == 200
    user.is_active = False
    user.save()
    assert _status(ml, _basic("alice", "new-secret")) == 401


@pytest.mark.django_db
def test_an_expired_login_is_checked_again(user, checks, monkeypatch):
    monkeypatch.setattr(auth, "VERIFIED_LOGINS", auth.VerifiedLogins(ttl_s=0.0))
    ml = Mlflow(user)
    for _ in range(2):
        assert _status(ml, _basic("alice", "pw-alice")) == 200
    assert checks == ["alice", "alice"]


@pytest.mark.django_db
def test_the_memory_is_bounded(user, other_user, checks, monkeypatch):
    monkeypatch.setattr(auth, "VERIFIED_LOGINS", auth.VerifiedLogins(size=1))
    ml = Mlflow(user)
    other = other_user.get_username()
    assert _status(ml, _basic("alice", "pw-alice")) == 200
    assert _status(ml, _basic(other, f"pw-{other}")) == 200  # pushes alice out
    assert _status(ml, _basic("alice", "pw-alice")) == 200
    assert checks == ["alice", other, "alice"]
