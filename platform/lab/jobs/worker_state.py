"""What this worker process is doing, shared by its threads: whether it is
shutting down and which run it trains.

``SHUTDOWN`` is set by the worker's shutdown signal (lab/jobs/signals.py: SIGTERM,
Ctrl-C, ``docker stop``). A supervisor then stops its trainer gracefully (it
checkpoints) and gives the run back to the queue without spending an attempt;
a trainer that stopped on a signal while it is set was interrupted, never
cancelled (lab/jobs/outcome.py). ``CURRENT_RUN`` is read by the live-worker
registry's heartbeat.
"""

from __future__ import annotations

import threading

SHUTDOWN = threading.Event()
CURRENT_RUN: dict[str, int | None] = {"id": None}
