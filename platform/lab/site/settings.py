"""Django settings, chosen by environment variables (docs/design.md, "processes").

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
    LAB_EXTERNAL_LOST_AFTER_S  an external run silent this long becomes "lost" (default 3600)
    LAB_LEASE_S             a trainer whose worker stopped renewing its lease stops (default STALE/2)
    LAB_REPUBLISH_AFTER_S   the reconciler re-sends the wake-up of a run queued this long
    LAB_DB_IDLE_TRANSACTION_MS  PostgreSQL ends a session idle in a transaction this long (60000)
    DJANGO_SECRET_KEY       required on PostgreSQL; on SQLite the lab keeps its own in var/
    DJANGO_DEBUG            1 turns Django's debug pages on (default off)
    LAB_HTTPS               1 behind a TLS proxy: secure cookies, HSTS, HTTPS redirect
    LAB_REWARD_MODULES      custom reward functions runs may name (module or module:function, comma-separated)
    DJANGO_ALLOWED_HOSTS, DJANGO_CSRF_TRUSTED_ORIGINS

Safe by default: DEBUG is off unless asked for, and there is no built-in
secret. On one machine with SQLite (the embedded default) a random key is
made once in var/secret_key (mode 0600); a team deployment on PostgreSQL must
pass DJANGO_SECRET_KEY or settings refuse to load.
"""

import os
import secrets
import socket
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from trainer.reward_functions import parse_entries as parse_reward_entries

BASE_DIR = Path(__file__).resolve().parents[3]  # the repository root
VAR_DIR = Path(os.environ.get("LAB_VAR_DIR", BASE_DIR / "var"))
RUNS_DIR = Path(os.environ.get("LAB_RUNS_DIR", VAR_DIR / "runs"))
# Folders every path a user names must lie in (":"-separated; lab.assets.roots):
# registered models and datasets, a run's model.source, task.data_file and
# task.eval_file. Empty: anywhere this server can read (`check --deploy` warns;
# `make up` sets the shipped data and var/). A team deployment sets the shared
# volume, so a login cannot make the server read, or the workers load, files
# outside it.
LAB_ASSET_ROOTS = [Path(p) for p in os.environ.get("LAB_ASSET_ROOTS", "").split(":") if p]
# Custom reward functions runs may name (task.verifier = "python"), comma-separated:
# "package.module" offers the functions defined in that module, "package.module:fn"
# one function (trainer/reward_functions.py). Reward code is trusted code: only an
# administrator lists it, the web process never imports it, and the worker's trainer
# runs it in a process of its own with a time bound per call. Empty: none offered.
try:
    LAB_REWARD_MODULES = parse_reward_entries(os.environ.get("LAB_REWARD_MODULES", ""))
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from None

# One machine on SQLite (the `make up` default, or any sqlite:// DATABASE_URL);
# a team deployment runs on a database server.
EMBEDDED = os.environ.get("DATABASE_URL", "sqlite://").startswith("sqlite://")


def _secret_key() -> str:
    if os.environ.get("DJANGO_SECRET_KEY"):
        return os.environ["DJANGO_SECRET_KEY"]
    if not EMBEDDED:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY: set it (e.g. python -c 'import secrets; "
            "print(secrets.token_urlsafe(50))') when DATABASE_URL is a database server"
        )
    # The embedded default's own key, made once: sessions survive restarts.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
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
    "drf_spectacular_sidecar",  # Swagger UI / ReDoc static files for /api/docs/
    # platform apps (package lab, source folder platform/); app labels stay the
    # bare names so table names and migration history are unchanged
    "lab.experiments",
    "lab.runs",
    "lab.jobs",
    "lab.assets",
    "lab.api",
    "lab.tracking",
    # the web wing: team review (app label "dashboard", tables unchanged) and the pages
    "dashboard.review",
    "dashboard.web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "lab.api.middleware.PayloadLimitMiddleware",
    "lab.api.middleware.QueryTextMiddleware",
    # Listed early so its process_exception runs last: a view that cannot reach the
    # database answers 503 + Retry-After, after every other handler declined.
    "lab.api.middleware.DatabaseUnavailableMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "lab.site.urls"
WSGI_APPLICATION = "lab.site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
# Connections are kept for 60 s between requests, and each request first checks
# that its kept connection still answers (CONN_HEALTH_CHECKS): after the database
# dropped them (a restart, a failover, pg_terminate_backend) a request opens a new
# one instead of answering 500 on the dead one.
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", _default_db_url),
        conn_max_age=60,
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web server, worker and reconciler share one file: WAL lets readers run
    # beside the writer, IMMEDIATE transactions take the write lock up front
    # (no "database is locked" on a read->write upgrade), and a busy timeout
    # waits for the lock instead of failing. Connections are kept as on
    # PostgreSQL (CONN_MAX_AGE above): opening one runs the PRAGMAs and registers
    # Django's SQL functions, 2-4 ms that a 1,000-point MLflow batch would pay on
    # every request (docs/benchmarks-archive.md, "MLflow ingestion"); an idle
    # connection in autocommit holds no snapshot, so WAL checkpoints still finish.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("LAB_TEST_SQLITE")}
else:
    # A process frozen inside a transaction (SIGSTOP, a paused VM) would hold its
    # row locks forever; the server ends such a session after this many ms, so
    # the reconciler can hand the frozen worker's run on. No product transaction
    # waits idle anywhere near this long.
    DATABASES["default"].setdefault("OPTIONS", {})["options"] = (
        "-c idle_in_transaction_session_timeout="
        + os.environ.get("LAB_DB_IDLE_TRANSACTION_MS", "60000")
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

# --------------------------------------------------------------------------- static files
STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
# plotly.js comes from the installed Python plotly package (dashboard/web/staticfiles.py), no CDN.
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "dashboard.web.staticfiles.PlotlyJsFinder",
]
# Serve app static files without collectstatic on one machine; a team
# deployment runs collectstatic (Dockerfile) and serves STATIC_ROOT.
WHITENOISE_USE_FINDERS = DEBUG or EMBEDDED
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
# MLflow artifacts (lab/tracking/artifact_store.py): where they are kept ('' = VAR_DIR/artifacts,
# file:///path, or s3://bucket/prefix with LAB_S3_ENDPOINT_URL for MinIO and the AWS_* credentials),
# and the largest file one upload may store (an artifact upload is exempt from the payload limit).
LAB_ARTIFACT_STORE = os.environ.get("LAB_ARTIFACT_STORE", "")
LAB_S3_ENDPOINT_URL = os.environ.get("LAB_S3_ENDPOINT_URL", "")
LAB_MAX_ARTIFACT_BYTES = int(os.environ.get("LAB_MAX_ARTIFACT_BYTES", 20 * 1024**3))
DATA_UPLOAD_MAX_MEMORY_SIZE = LAB_MAX_PAYLOAD_BYTES

# --------------------------------------------------------------------------- REST API
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "lab.api.errors.json_exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "lab.api.json_parser.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "lab.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "MoE-RL Stability Lab API",
    "DESCRIPTION": "Experiments, runs, metrics and the job queue.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # Browsable docs from local static files, never a CDN
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # Runs, exports, datasets, TensorBoard imports and logged models each have a
    # "status" field: one schema name per choice set (exports and imports share
    # one set: queued, running, succeeded, failed).
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "lab.runs.models.RunStatus",
        "JobStatusEnum": "lab.runs.models.ExportStatus",
        "DatasetStatusEnum": "lab.assets.models.DatasetStatus",
        "LoggedModelStatusEnum": "lab.tracking.models.LoggedModelStatus",
    },
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
    # run, so a run longer than this is delivered again: the claim
    # (jobs.services.claim_next) makes that second delivery a plain wake-up
    # (it claims the next queued run, if any, or does nothing).
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": int(os.environ.get("LAB_VISIBILITY_TIMEOUT", 6 * 3600)),
        "polling_interval": 0.1,
    }

# Rights and limits (docs/platform.md "Rights" and "Limits").
LAB_MAX_USER_PRIORITY = int(os.environ.get("LAB_MAX_USER_PRIORITY", 5))  # above: staff only
LAB_MAX_MODEL_PARAMS = int(float(os.environ.get("LAB_MAX_MODEL_PARAMS", 2e9)))
LAB_MAX_QUEUED_RUNS_PER_USER = int(os.environ.get("LAB_MAX_QUEUED_RUNS_PER_USER", 500))
LAB_MAX_SWEEP_RUNS = int(os.environ.get("LAB_MAX_SWEEP_RUNS", 256))
# A dataset file larger than this is checked by the control queue's worker, not inside
# the web request that registers it (it shows as "checking" until then).
LAB_DATASET_INLINE_BYTES = int(os.environ.get("LAB_DATASET_INLINE_BYTES", 16 * 1024**2))
# A checkpoint with more weight bytes than this has its weights scanned for NaN and Inf
# by the control queue's worker (about 1 GB/s), not inside the request that registers it.
LAB_MODEL_INLINE_BYTES = int(os.environ.get("LAB_MODEL_INLINE_BYTES", 2 * 1024**3))
# A TensorBoard folder with more event-file bytes than this is imported by the control
# queue's worker (tracking/tb_jobs.py), not inside the request; a running import whose
# worker stopped heartbeating this long is failed by the reconciler.
LAB_TENSORBOARD_INLINE_BYTES = int(os.environ.get("LAB_TENSORBOARD_INLINE_BYTES", 1024**2))
LAB_IMPORT_STALE_AFTER_S = float(os.environ.get("LAB_IMPORT_STALE_AFTER_S", 1800))
LAB_QUEUES = [q for q in os.environ.get("LAB_QUEUES", "cpu,gpu-a100").split(",") if q]
LAB_DEFAULT_QUEUE = os.environ.get("LAB_DEFAULT_QUEUE", "cpu")
# What this worker process can run (lab/jobs/capacity.py): GPUs it owns (default:
# the devices in CUDA_VISIBLE_DEVICES) and, on a host without GPUs, CPU slots
# (one gloo rank on one thread each) for runs with run.gpus > 1.
LAB_WORKER_GPUS = int(os.environ["LAB_WORKER_GPUS"]) if os.environ.get("LAB_WORKER_GPUS") else None
LAB_WORKER_CPU_SLOTS = int(os.environ.get("LAB_WORKER_CPU_SLOTS", 1))
# Several runs per GPU (lab/jobs/capacity.py): slots of this many GB per GPU, one
# worker per slot (unset: whole GPUs); the GPUs' memory when nvidia-smi cannot tell.
LAB_GPU_SLOT_GB = (
    float(os.environ["LAB_GPU_SLOT_GB"]) if os.environ.get("LAB_GPU_SLOT_GB") else None
)
LAB_GPU_MEMORY_GB = (
    float(os.environ["LAB_GPU_MEMORY_GB"]) if os.environ.get("LAB_GPU_MEMORY_GB") else None
)
# Where workers on one host lease their GPUs (lab/jobs/capacity.py): host-local.
LAB_DEVICE_LOCK_DIR = os.environ.get("LAB_DEVICE_LOCK_DIR", "/tmp/moe-lab-gpus")
# Runs over several workers (run.nodes > 1, lab/jobs/gang.py): the seconds a gang
# may take to assemble, the address other hosts reach this worker's rendezvous
# store at, and the ports it may use (open them between worker hosts).
LAB_GANG_TIMEOUT_S = float(os.environ.get("LAB_GANG_TIMEOUT_S", 120))
LAB_RDZV_HOST = os.environ.get("LAB_RDZV_HOST", socket.gethostname())
LAB_RDZV_PORTS = os.environ.get("LAB_RDZV_PORTS", "29400-29499")
LAB_HEARTBEAT_S = float(os.environ.get("LAB_HEARTBEAT_S", 5))
LAB_STALE_AFTER_S = float(os.environ.get("LAB_STALE_AFTER_S", 60))
# A trainer whose worker has not renewed its lease for this long stops (no checkpoint),
# well before the reconciler gives its run to another attempt.
LAB_LEASE_S = float(os.environ.get("LAB_LEASE_S", LAB_STALE_AFTER_S / 2))
# A queued run whose wake-up is older than this, and not covered by waiting messages,
# gets a new one from the reconciler (the broker lost it).
LAB_REPUBLISH_AFTER_S = float(os.environ.get("LAB_REPUBLISH_AFTER_S", 60))
LAB_MAX_ATTEMPTS = int(os.environ.get("LAB_MAX_ATTEMPTS", 3))
# An external run (MLflow, TensorBoard import) that sends nothing this long becomes
# "lost" (its outcome unknown); a write revives it, its owner may end it.
LAB_EXTERNAL_LOST_AFTER_S = float(os.environ.get("LAB_EXTERNAL_LOST_AFTER_S", 3600))
LAB_RECONCILE_EVERY_S = float(os.environ.get("LAB_RECONCILE_EVERY_S", 15))
LAB_METRICS_BATCH = int(os.environ.get("LAB_METRICS_BATCH", 500))
LAB_POLL_S = float(os.environ.get("LAB_POLL_S", 0.5))
LAB_TERM_GRACE_S = float(os.environ.get("LAB_TERM_GRACE_S", 300))  # SIGTERM -> SIGKILL

# --------------------------------------------------------------------------- security
# Behind a TLS-terminating proxy (LAB_HTTPS=1, the docker-compose default):
# cookies only over HTTPS, HSTS, and a redirect of plain HTTP except for the
# health check that load balancers and compose probe over plain HTTP.
LAB_HTTPS = os.environ.get("LAB_HTTPS", "0") == "1"
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = LAB_HTTPS
SECURE_SSL_REDIRECT = LAB_HTTPS
SECURE_REDIRECT_EXEMPT = [r"^api/health$"]
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if LAB_HTTPS else None
SECURE_HSTS_SECONDS = int(os.environ.get("LAB_HSTS_SECONDS", 31536000)) if LAB_HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = LAB_HTTPS
SECURE_HSTS_PRELOAD = LAB_HTTPS
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Debug pages (DJANGO_DEBUG=1) hide settings with credentials in their values
# too: database and broker URLs carry passwords.
DEFAULT_EXCEPTION_REPORTER_FILTER = "lab.site.error_reports.CredentialHidingFilter"

# Every 500 is logged with its traceback to stderr (django.request), also with
# DEBUG off; under docker-compose that is `docker compose logs web`.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "jobs": {"handlers": ["console"], "level": "INFO"},
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
        "lab.api": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}
