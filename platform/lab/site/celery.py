"""The Celery app. The database is the state of record; the broker only
carries wake-ups (docs/design.md, "processes").

Reliability settings, and why:
- acks_late + reject_on_worker_lost: a message is acknowledged only after the
  task returns, so a worker killed mid-run leaves it to be delivered again;
- prefetch multiplier 1: a worker holds at most the run it is training, so
  queued runs wait in the broker where any free worker can take them;
- no result backend: run status lives in the Run row.

Worker per GPU (document of record, also in docs/platform.md):

    CUDA_VISIBLE_DEVICES=0 PYTHONPATH=platform:. .venv/bin/celery -A lab.site worker \
        -Q gpu-a100 -n gpu0@%h --pool solo --concurrency 1 --prefetch-multiplier 1
"""

import os

from celery import Celery
from django.conf import settings

from lab.jobs import fs_broker  # noqa: F401  (filesystem:// writes whole messages)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.site.settings")

app = Celery("lab.site")
# The packages below the site (runs, assets, jobs) publish through
# ``celery.current_app`` and never import this module (docs/design.md 1.2). The
# default app is what current_app is in every thread, not only in this one.
app.set_default()
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    broker_url=settings.CELERY_BROKER_URL,
    broker_transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
    broker_connection_retry_on_startup=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    result_backend=None,
    task_default_queue=settings.LAB_DEFAULT_QUEUE,
    task_create_missing_queues=True,
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    beat_schedule={
        "reconcile-stale-runs": {
            "task": "jobs.tasks.reconcile",
            "schedule": settings.LAB_RECONCILE_EVERY_S,
            # The reconciler is cheap and idempotent; a dedicated queue keeps it
            # from waiting behind hours-long training runs.
            "options": {"queue": "control"},
        },
        # TensorBoard imports (tracking/tb_jobs.py): a lost message sent again, an import
        # whose worker died ended, so none stays running.
        "reconcile-imports": {
            "task": "tracking.reconcile_imports",
            "schedule": settings.LAB_RECONCILE_EVERY_S,
            "options": {"queue": "control"},
        },
    },
)
app.autodiscover_tasks()
