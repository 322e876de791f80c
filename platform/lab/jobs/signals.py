"""Worker lifecycle: register in the live-worker table and keep it fresh;
on shutdown, tell a running supervisor to stop its trainer gracefully."""

from __future__ import annotations

import logging
import os
import threading

from celery.signals import worker_ready, worker_shutdown, worker_shutting_down
from django.db import close_old_connections

log = logging.getLogger("jobs")
REGISTRY_PERIOD_S = 5.0
_stop = threading.Event()


def _registry_loop(hostname: str, queues: list[str]) -> None:
    from lab.jobs import capacity, services, supervisor

    owns = capacity.this_worker()
    while not _stop.is_set():
        try:
            close_old_connections()
            services.register_worker(
                hostname,
                queues=queues,
                pid=os.getpid(),
                gpu_index=",".join(owns.devices),
                gpus=owns.gpus,
                cpu_slots=owns.cpu_slots,
                current_run_id=supervisor.CURRENT_RUN["id"],
            )
        except Exception:  # a DB hiccup must not kill the worker; retry next period
            log.exception("worker registry update failed")
        _stop.wait(REGISTRY_PERIOD_S)


@worker_ready.connect
def _on_worker_ready(sender=None, **_kwargs) -> None:
    hostname = sender.hostname
    queues = sorted(sender.app.amqp.queues.consume_from.keys())
    threading.Thread(
        target=_registry_loop, args=(hostname, queues), name="lab-registry", daemon=True
    ).start()


@worker_shutting_down.connect
def _on_shutting_down(**_kwargs) -> None:
    from lab.jobs import supervisor

    supervisor.SHUTDOWN.set()


@worker_shutdown.connect
def _on_shutdown(sender=None, **_kwargs) -> None:
    _stop.set()
    hostname = getattr(sender, "hostname", None)
    if hostname:
        try:
            from lab.jobs import services

            services.unregister_worker(hostname)
        except Exception:
            log.exception("could not unregister worker %s", hostname)
