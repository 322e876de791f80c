"""Worker lifecycle: register in the live-worker table and keep it fresh;
on shutdown, tell a running supervisor to stop its trainer gracefully. The
reconciler's embedded scheduler (Celery beat, a child process of the
``control`` worker) dies with that worker."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading

from celery.signals import (
    beat_embedded_init,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)
from django.db import close_old_connections

from lab.jobs.worker_state import CURRENT_RUN, SHUTDOWN

log = logging.getLogger("jobs")
REGISTRY_PERIOD_S = 5.0
_stop = threading.Event()


def _registry_loop(hostname: str, queues: list[str]) -> None:
    from lab.jobs import capacity, services

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
                current_run_id=CURRENT_RUN["id"],
            )
        except Exception:  # a DB hiccup must not kill the worker; retry next period
            log.exception("worker registry update failed")
        _stop.wait(REGISTRY_PERIOD_S)


@worker_ready.connect
def _on_worker_ready(sender=None, **_kwargs) -> None:
    from lab.jobs import capacity

    try:
        owns = capacity.this_worker()  # lease the GPUs before taking any work
    except capacity.DeviceBusy as exc:
        # A worker without its devices must not claim runs (two trainers on one GPU).
        log.critical("worker cannot start: %s", exc)
        print(f"worker cannot start: {exc}", file=sys.stderr, flush=True)
        os._exit(2)
    log.info("worker owns %s", owns.describe())
    print(f"worker owns {owns.describe()}", file=sys.stderr, flush=True)
    hostname = sender.hostname
    queues = sorted(sender.app.amqp.queues.consume_from.keys())
    threading.Thread(
        target=_registry_loop, args=(hostname, queues), name="lab-registry", daemon=True
    ).start()


@worker_shutting_down.connect
def _on_shutting_down(**_kwargs) -> None:
    SHUTDOWN.set()  # a trainer that stops now was interrupted, never cancelled


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


PR_SET_PDEATHSIG = 1  # linux/prctl.h


@beat_embedded_init.connect
def _die_with_the_worker(**_kwargs) -> None:
    """``celery worker -B`` runs beat in a forked child. Killed with SIGKILL, the
    worker cannot stop it: the orphan would keep sending every tick, and after a
    restart two schedulers would. So the kernel kills the child when its parent
    dies (PR_SET_PDEATHSIG, as the trainer's exec shim does), and a child whose
    parent is already gone (it died before the prctl) exits at once."""
    parent = multiprocessing.parent_process()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: nothing ties the child to its parent
        log.warning("beat: cannot ask to die with the worker (no prctl)")
        return
    if parent is not None and os.getppid() != parent.pid:
        log.error("beat: the worker that started it is gone; exiting")
        os._exit(1)
