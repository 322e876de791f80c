"""The review's statistics imported in the background after a web process serves
its first request.

The stability review fits Cox models and bootstrap intervals (lifelines, scipy,
pandas: about 3 s of imports on a loaded 2-core machine), imported lazily so that
a web process starts fast and small (docs/benchmarks-archive.md, "Web process start").
Without this, the first review of a process waits for them; with it, they load
while the user is on the page before (a login, the experiment page), and the
review itself takes its warm time (bench/bench_review.py). Off where
``LAB_WARM_IMPORTS`` is "0" (the test suite: every process would pay for it).
"""

from __future__ import annotations

import importlib
import os
import threading

from django.core.signals import request_started

# What the review's first request would otherwise import.
MODULES = ("pandas", "scipy.stats", "lifelines", "trainer.analysis.survival")
_started = threading.Event()


def _import_all() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # the review reports a missing extra itself, when asked
            return


def on_first_request(**kwargs) -> None:
    """Start the imports once, in a daemon thread, and stop listening."""
    if _started.is_set():
        return
    _started.set()
    request_started.disconnect(on_first_request)
    if os.environ.get("LAB_WARM_IMPORTS", "1") == "0":
        return
    threading.Thread(target=_import_all, name="review-warmup", daemon=True).start()


def connect() -> None:
    request_started.connect(on_first_request)
