"""Django settings, chosen by environment variables (DESIGN.md section 4).

Embedded default (nothing to install): SQLite in var/ and Celery on kombu's
filesystem transport in var/broker/. Team deployment: DATABASE_URL selects
PostgreSQL and CELERY_BROKER_URL selects Redis.

Environment variables:
    DATABASE_URL            e.g. postgres://lab:secret@db:5432/lab (default: SQLite var/db.sqlite3)
    CELERY_BROKER_URL       e.g. redis://redis:6379/0 (default: filesystem:// in var/broker)
    LAB_VAR_DIR             where SQLite, the file broker and run folders live (default ./var)
    LAB_RUNS_DIR            run folders (default LAB_VAR_DIR/runs)
    LAB_VISIBILITY_TIMEOUT  Redis redelivery timeout for unacknowledged tasks, seconds
    LAB_HEARTBEAT_S         worker heartbeat period while a run trains, seconds
    LAB_STALE_AFTER_S       a running run whose heartbeat is older than this is requeued
    LAB_MAX_ATTEMPTS        attempts before a run that keeps losing its worker is failed
    DJANGO_SECRET_KEY, DJANGO_DEBUG, DJANGO_ALLOWED_HOSTS, DJANGO_CSRF_TRUSTED_ORIGINS
"""

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(os.environ.get("LAB_VAR_DIR", BASE_DIR / "var"))
RUNS_DIR = Path(os.environ.get("LAB_RUNS_DIR", VAR_DIR / "runs"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
CSRF_TRUSTED_ORIGINS = [
    o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    # project apps (platform/ is a source folder: imported by their own names)
    "experiments",
    "runs",
    "jobs",
    "api",
    "web",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "api.middleware.PayloadLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "labsite.urls"
WSGI_APPLICATION = "labsite.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "platform" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# --------------------------------------------------------------------------- database
_default_db_url = f"sqlite:///{VAR_DIR / 'db.sqlite3'}"
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", _default_db_url), conn_max_age=60
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web server, worker and reconciler share one file: WAL lets readers run
    # beside the writer, IMMEDIATE transactions take the write lock up front
    # (no "database is locked" on a read->write upgrade), and a busy timeout
    # waits for the lock instead of failing.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("LAB_TEST_SQLITE")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

# --------------------------------------------------------------------------- static files
STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
# plotly.js comes from the installed Python plotly package (dashboard/staticfiles.py), no CDN.
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "dashboard.staticfiles.PlotlyJsFinder",
]
WHITENOISE_USE_FINDERS = DEBUG  # serve app static files without collectstatic in development
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # collectstatic fills it; whitenoise needs it
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Largest request body the API and forms accept; bigger ones get a 413 JSON error.
LAB_MAX_PAYLOAD_BYTES = int(os.environ.get("LAB_MAX_PAYLOAD_BYTES", 256 * 1024))
DATA_UPLOAD_MAX_MEMORY_SIZE = LAB_MAX_PAYLOAD_BYTES

# --------------------------------------------------------------------------- REST API
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.errors.json_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "MoE-RL Stability Lab API",
    "DESCRIPTION": "Experiments, runs, metrics and the job queue.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
}

# --------------------------------------------------------------------------- Celery
BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport: producer writes to data_folder_out, consumer
    # reads data_folder_in; on one machine both are the same folder. The control
    # folder carries broadcast (fanout) messages, processed messages are kept
    # for inspection, and 0.1 s polling keeps the queue latency low.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
        "polling_interval": 0.1,
    }
    for _folder in ("queue", "control", "processed"):
        (BROKER_DIR / _folder).mkdir(parents=True, exist_ok=True)  # kombu does not create them
else:
    # Redis re-delivers a task that is not acknowledged within the visibility
    # timeout. With acks_late a training run holds its message for the whole
    # run, so a run longer than this is delivered again: the atomic claim
    # (jobs.services.claim_run) makes that second delivery exit at once.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": int(os.environ.get("LAB_VISIBILITY_TIMEOUT", 6 * 3600)),
        "polling_interval": 0.1,
    }

LAB_QUEUES = [q for q in os.environ.get("LAB_QUEUES", "cpu,gpu-a100").split(",") if q]
LAB_DEFAULT_QUEUE = os.environ.get("LAB_DEFAULT_QUEUE", "cpu")
LAB_HEARTBEAT_S = float(os.environ.get("LAB_HEARTBEAT_S", 5))
LAB_STALE_AFTER_S = float(os.environ.get("LAB_STALE_AFTER_S", 60))
LAB_MAX_ATTEMPTS = int(os.environ.get("LAB_MAX_ATTEMPTS", 3))
LAB_RECONCILE_EVERY_S = float(os.environ.get("LAB_RECONCILE_EVERY_S", 15))
LAB_METRICS_BATCH = int(os.environ.get("LAB_METRICS_BATCH", 500))
LAB_POLL_S = float(os.environ.get("LAB_POLL_S", 0.5))
LAB_TERM_GRACE_S = float(os.environ.get("LAB_TERM_GRACE_S", 300))  # SIGTERM -> SIGKILL

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"jobs": {"handlers": ["console"], "level": "INFO"}},
}
