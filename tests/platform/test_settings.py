"""Settings chosen by environment variables (embedded default vs team deployment)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _settings_in_subprocess(env: dict[str, str], expr: str) -> str:
    code = (
        "import sys; sys.path[:0] = ['.', 'platform'];"
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'labsite.settings');"
        "django.setup(); from django.conf import settings; from labsite.celery import app;"
        f"print({expr})"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_embedded_default_is_sqlite_and_filesystem_broker(tmp_path):
    env = {"LAB_VAR_DIR": str(tmp_path)}
    engine = _settings_in_subprocess(env, "settings.DATABASES['default']['ENGINE']")
    assert engine == "django.db.backends.sqlite3"
    db_name = _settings_in_subprocess(env, "settings.DATABASES['default']['NAME']")
    assert db_name == str(tmp_path / "db.sqlite3")
    opts = eval(_settings_in_subprocess(env, "app.conf.broker_transport_options"))
    assert app_url(env) == "filesystem://"
    assert opts["data_folder_in"] == opts["data_folder_out"] == str(tmp_path / "broker" / "queue")
    assert opts["control_folder"] == str(tmp_path / "broker" / "control")
    assert opts["processed_folder"] == str(tmp_path / "broker" / "processed")
    assert opts["polling_interval"] == 0.1


def app_url(env):
    return _settings_in_subprocess(env, "app.conf.broker_url")


def test_team_deployment_is_postgres_and_redis_with_visibility_timeout(tmp_path):
    env = {
        "LAB_VAR_DIR": str(tmp_path),
        "DATABASE_URL": "postgres://lab:pw@db:5432/lab",
        "CELERY_BROKER_URL": "redis://redis:6379/0",
        "LAB_VISIBILITY_TIMEOUT": "7200",
    }
    engine = _settings_in_subprocess(env, "settings.DATABASES['default']['ENGINE']")
    assert engine == "django.db.backends.postgresql"
    assert app_url(env) == "redis://redis:6379/0"
    opts = eval(_settings_in_subprocess(env, "app.conf.broker_transport_options"))
    assert opts["visibility_timeout"] == 7200


@pytest.mark.parametrize(
    "name, expected",
    [
        ("task_acks_late", True),
        ("task_reject_on_worker_lost", True),
        ("worker_prefetch_multiplier", 1),
    ],
)
def test_celery_reliability_settings(name, expected):
    from labsite.celery import app

    assert app.conf[name] == expected


def test_rest_framework_auth_and_static():
    from django.conf import settings

    auth = settings.REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]
    assert "rest_framework.authentication.TokenAuthentication" in auth
    assert "rest_framework.authentication.SessionAuthentication" in auth
    assert settings.STATIC_URL == "/static/"
    assert "whitenoise.middleware.WhiteNoiseMiddleware" in settings.MIDDLEWARE
