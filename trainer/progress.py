"""Progress reporting: a one-line bar on a terminal, plain lines otherwise
(a platform worker's log, CI), so logs stay readable when captured."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, start: int = 0, stream: TextIO | None = None, every: int = 10):
        self.total = total
        self.start = start
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every = every
        self.t0 = time.perf_counter()

    def update(self, step: int, info: dict[str, float]) -> None:
        done = step + 1
        elapsed = time.perf_counter() - self.t0
        rate = (done - self.start) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        fields = "  ".join(f"{k} {v:.3g}" for k, v in info.items())
        if self.tty:
            width = 24
            filled = int(width * done / max(self.total, 1))
            bar = "#" * filled + "-" * (width - filled)
            line = f"\r[{bar}] {done}/{self.total}  {fields}  eta {eta:.0f}s"
            self.stream.write(line[:200])
            if done == self.total:
                self.stream.write("\n")
        elif done == self.total or done % self.every == 0 or done == self.start + 1:
            self.stream.write(f"step {done}/{self.total}  {fields}  ({elapsed:.1f}s)\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if self.tty:
            self.stream.write("\n")
        self.stream.write(text + "\n")
        self.stream.flush()
