"""Health of the parts a run depends on: database, broker, the reconciler, live workers.

The reconciler is the worker of the ``control`` queue with Celery beat inside
(``launch.reconciler_command``); like every worker it keeps a ``Worker`` row
fresh, so it is up when such a row was seen within ``LIVE_WITHIN_S`` and says
its scheduler child lives (a worker whose beat was killed sends no reconcile). Without
it nothing requeues a lost run, re-sends a lost wake-up or runs an export, so
the deployment is not healthy.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from lab.jobs.models import Worker

LIVE_WITHIN_S = 30.0


def check_db() -> dict[str, Any]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"ok": True, "vendor": connection.vendor}
    except Exception as exc:
        return {"ok": False, "vendor": connection.vendor, "error": str(exc)}


def check_broker() -> dict[str, Any]:
    from celery import (
        current_app as app,
    )  # lab.site.celery's app (design.md 1.2)

    transport = app.conf.broker_url.split("://", 1)[0]
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return {"ok": True, "transport": transport}
    except Exception as exc:
        return {"ok": False, "transport": transport, "error": str(exc)}


def live_workers() -> list[dict[str, Any]]:
    return [
        {
            "hostname": w.hostname,
            "queues": w.queues,
            "gpu_index": w.gpu_index,
            "gpus": w.gpus,
            "cpu_slots": w.cpu_slots,
            "pid": w.pid,
            "last_seen": w.last_seen.isoformat(),
            "current_run": w.current_run_id,
            "beat_pid": w.beat_pid,
            "beat_alive": w.beat_alive,
        }
        for w in Worker.live(LIVE_WITHIN_S)
    ]


CONTROL_QUEUE = "control"


def check_reconciler(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """Up when a live worker serves the control queue AND its embedded scheduler
    (Celery beat, the child that sends every reconcile) lives: a worker whose beat
    died is alive but reconciles nothing."""
    serving = [w for w in workers if CONTROL_QUEUE in w["queues"]]
    scheduling = [w for w in serving if w.get("beat_alive")]
    if scheduling:
        return {
            "ok": True,
            "hostname": scheduling[0]["hostname"],
            "beat_pid": scheduling[0]["beat_pid"],
        }
    if serving:
        dead = [w for w in serving if w.get("beat_alive") is False]
        if dead:
            error = (
                f"the reconciler's scheduler (celery beat, pid {dead[0]['beat_pid']}) on "
                f"{dead[0]['hostname']} died: no reconcile is sent; restart the reconciler"
            )
        else:
            error = (
                f"the worker on the {CONTROL_QUEUE!r} queue ({serving[0]['hostname']}) runs no "
                "scheduler: start the reconciler with -B (celery -A lab.site worker -B -Q control)"
            )
        return {"ok": False, "hostname": serving[0]["hostname"], "error": error}
    return {
        "ok": False,
        "error": f"no live worker on the {CONTROL_QUEUE!r} queue within {LIVE_WITHIN_S:.0f} s "
        "(start the reconciler: celery -A lab.site worker -B -Q control)",
    }


def health() -> dict[str, Any]:
    db = check_db()
    workers = live_workers() if db["ok"] else []
    broker = check_broker()
    reconciler = check_reconciler(workers)
    queues = sorted({q for w in workers for q in w["queues"]})
    return {
        "ok": db["ok"] and broker["ok"] and reconciler["ok"],
        "db": db,
        "broker": broker,
        "reconciler": reconciler,
        "workers": workers,
        "queues": queues,
    }
