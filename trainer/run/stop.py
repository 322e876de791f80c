"""How a run is asked to stop: SIGTERM/SIGINT set a flag the loop reads between
steps (and the warm start between its steps), so a stop always lands on a step
boundary with a checkpoint (docs/design.md 3.3)."""

from __future__ import annotations

import contextlib
import signal
from typing import Any


class StopFlag:
    """Set by SIGTERM/SIGINT; the loop checks it between steps."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            # signal() raises ValueError outside the main thread (e.g. a test runner thread).
            with contextlib.suppress(ValueError):
                self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        self.requested = True


class StopRequested(Exception):
    """SIGTERM/SIGINT arrived during the warm start (before any RL state exists)."""
