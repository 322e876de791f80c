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
KEEP_ROW = threading.Event()  # set when the worker stops because its scheduler died


def _registry_loop(hostname: str, queues: list[str], beat=None) -> None:
    """Keep this worker's row fresh. With an embedded scheduler (``beat``, the
    reconciler's ``celery worker -B`` child), also report whether it lives: a
    scheduler that died (a kill -9, an OOM kill) sends no reconcile any more, so
    the worker records it (``/api/health`` reports the reconciler down, naming the
    scheduler) and stops itself; ``make up`` then stops everything with a message,
    and a supervisor that restarts services (docker-compose) starts a whole one."""
    from lab.jobs import capacity, services

    owns = capacity.this_worker()
    while not _stop.is_set():
        beat_alive = beat.is_alive() if beat is not None else None
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
                beat_pid=getattr(beat, "pid", None),
                beat_alive=beat_alive,
            )
        except Exception:  # a DB hiccup must not kill the worker; retry next period
            log.exception("worker registry update failed")
        if beat_alive is False:
            _scheduler_lost(beat)
            return
        _stop.wait(REGISTRY_PERIOD_S)


def _scheduler_lost(beat) -> None:
    """The embedded scheduler died: keep the row that says so, and stop the worker."""
    message = (
        f"the reconciler's scheduler (celery beat, pid {beat.pid}) died with exit code "
        f"{beat.exitcode}; stopping this worker so that it is restarted whole"
    )
    log.critical(message)
    print(message, file=sys.stderr, flush=True)
    KEEP_ROW.set()  # /api/health names the dead scheduler until the row ages out
    os.kill(os.getpid(), signal.SIGTERM)  # warm shutdown: nothing of a run is lost


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
    beat = getattr(getattr(sender, "controller", None), "beat", None)  # worker -B's child
    threading.Thread(
        target=_registry_loop, args=(hostname, queues, beat), name="lab-registry", daemon=True
    ).start()


@worker_shutting_down.connect
def _on_shutting_down(**_kwargs) -> None:
    SHUTDOWN.set()  # a trainer that stops now was interrupted, never cancelled


@worker_shutdown.connect
def _on_shutdown(sender=None, **_kwargs) -> None:
    _stop.set()
    hostname = getattr(sender, "hostname", None)
    if hostname and not KEEP_ROW.is_set():
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
