"""Tail RUN_DIR/metrics.jsonl: return the complete lines written since the last read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def parse_lines(blob: bytes) -> list[dict[str, Any]]:
    """JSON objects of complete lines; a torn or foreign line is skipped, never fatal."""
    out = []
    for line in blob.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


class MetricsTail:
    """Reads only what was appended, and only up to the last newline (a line the
    trainer is still writing waits for the next read). A file that shrank was
    rewritten by a resumed trainer (it drops lines past its checkpoint): start over;
    the ingestion is idempotent per (run, step), so re-reading is harmless."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0

    def read_new(self) -> list[dict[str, Any]]:
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
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        return parse_lines(chunk[: end + 1])

    def read_all(self) -> list[dict[str, Any]]:
        """The whole file (the final pass after the trainer exits)."""
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            return []
        end = blob.rfind(b"\n")
        self.offset = end + 1
        return parse_lines(blob[: end + 1])
