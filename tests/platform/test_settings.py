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
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'lab.site.settings');"
        "django.setup(); from django.conf import settings; from lab.site.celery import app;"
        f"print({expr})"
    )
    out = _python(code, env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _python(code_or_args, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run python with the test environment minus the deployment variables plus ``env``."""
    unset = ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SECRET_KEY", "DJANGO_DEBUG", "LAB_HTTPS")
    clean = {k: v for k, v in os.environ.items() if k not in unset}
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True
    )


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
        "DJANGO_SECRET_KEY": "k" * 50,
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
    from lab.site.celery import app

    assert app.conf[name] == expected


def test_rest_framework_auth_and_static():
    from django.conf import settings

    auth = settings.REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]
    assert "rest_framework.authentication.TokenAuthentication" in auth
    assert "rest_framework.authentication.SessionAuthentication" in auth
    assert settings.STATIC_URL == "/static/"
    assert "whitenoise.middleware.WhiteNoiseMiddleware" in settings.MIDDLEWARE


# --------------------------------------------------------------------------- safe defaults
def test_debug_is_off_unless_asked_for(tmp_path):
    env = {"LAB_VAR_DIR": str(tmp_path)}
    assert _settings_in_subprocess(env, "settings.DEBUG") == "False"
    assert _settings_in_subprocess({**env, "DJANGO_DEBUG": "1"}, "settings.DEBUG") == "True"


def test_team_deployment_without_a_secret_refuses_to_start(tmp_path):
    env = {"LAB_VAR_DIR": str(tmp_path), "DATABASE_URL": "postgres://lab:pw@db:5432/lab"}
    out = _python(
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'lab.site.settings';"
        "django.setup()",
        env,
    )
    assert out.returncode != 0
    assert "DJANGO_SECRET_KEY" in out.stderr


def test_embedded_default_makes_its_own_secret_once(tmp_path):
    env = {"LAB_VAR_DIR": str(tmp_path)}
    first = _settings_in_subprocess(env, "settings.SECRET_KEY")
    assert first == _settings_in_subprocess(env, "settings.SECRET_KEY")  # sessions survive
    assert len(first) >= 50 and "insecure" not in first
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    other = tmp_path / "other"
    assert _settings_in_subprocess({"LAB_VAR_DIR": str(other)}, "settings.SECRET_KEY") != first


def test_debug_page_hides_database_and_broker_urls():
    from django.conf import settings
    from django.views.debug import get_default_exception_reporter_filter

    reporter_filter = get_default_exception_reporter_filter()  # what error pages use
    assert type(reporter_filter).__name__ == "CredentialHidingFilter"
    shown = reporter_filter.get_safe_settings()
    for name in ("DATABASES", "CELERY_BROKER_URL", "SECRET_KEY"):
        assert shown[name] == reporter_filter.cleansed_substitute, name
    assert settings.DATABASES["default"]["ENGINE"]  # the real settings are untouched
