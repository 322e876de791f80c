"""Tail RUN_DIR/metrics.jsonl: return the complete lines written since the last read.

The line format and its parsing are the trainer's (trainer/run_folder/files.py
``parse_metric_lines``); this module only tracks how far the file was read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainer.run_folder.files import parse_metric_lines


class MetricsTail:
    """Reads only what was appended, and only up to the last newline (a line the
    trainer is still writing waits for the next read). A file that shrank was
    rewritten by a resumed trainer (it drops lines past its checkpoint): start over;
    the ingestion is idempotent per (run, step), so re-reading is harmless."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        """Records of the complete lines appended since the last read."""
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return []
        if size < self.offset:
            self.offset = 0
        if size == self.offset:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read(size - self.offset)
        records, partial = parse_metric_lines(chunk)
        self.offset += len(chunk) - len(partial)
        return records

    def read_all(self) -> list[dict[str, Any]]:
        """The whole file (the final pass after the trainer exits)."""
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            return []
        records, partial = parse_metric_lines(blob)
        self.offset = len(blob) - len(partial)
        return records
