"""Progress reporting: a tqdm bar on a terminal, plain lines otherwise (a platform
worker's log, CI), so captured logs stay readable.

The platform worker reads metrics.jsonl, not these lines; the plain lines
(``step N/TOTAL  key value ...  (Ts)``) are for people reading a log.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm


class Progress:
    """``update(step, info)`` after each step; ``message(text)`` for a log line."""

    def __init__(self, total: int, start: int = 0, stream: TextIO | None = None, every: int = 10):
        self.total = total
        self.start = start
        self.stream = stream or sys.stderr
        self.every = every
        self.t0 = time.perf_counter()
        self.bar: tqdm | None = None
        if self.stream.isatty():
            self.bar = tqdm(total=total, initial=start, file=self.stream, unit="step")

    def begin(self, step: int) -> None:
        """The run starts (or resumes) at ``step``."""
        self.start = step
        self.t0 = time.perf_counter()
        if self.bar is not None:
            self.bar.reset(total=self.total)
            self.bar.update(step)

    def update(self, step: int, info: dict[str, float]) -> None:
        done = step + 1
        if self.bar is not None:
            self.bar.n = done  # absolute: a resumed run starts mid-way
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in info.items()}, refresh=False)
            self.bar.refresh()
            if done == self.total:
                self.bar.close()
            return
        if done == self.total or done % self.every == 0 or done == self.start + 1:
            fields = "  ".join(f"{k} {v:.3g}" for k, v in info.items())
            elapsed = time.perf_counter() - self.t0
            self.stream.write(f"step {done}/{self.total}  {fields}  ({elapsed:.1f}s)\n")
            self.stream.flush()

    def message(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)  # above the bar, which redraws below
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
