"""The run folder's files (docs/design.md, "run folder"): config.json, metrics.jsonl, summary.json.

metrics.jsonl gets one JSON object per step, flushed as it is written so a
platform worker can tail it. On resume, lines past the checkpoint's step are
dropped first: a resumed run never writes a step twice.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"
LOG_FILE = "trainer.log"  # the child's stdout/stderr, written by the platform worker
CHECKPOINT_DIR = "checkpoints"  # resumable state (trainer.run.checkpoint)
CHECKPOINT_NAME = "last.pt"  # the one checkpoint a run keeps (or the name of its shards)
PROGRESS_FILE = "progress.json"  # the warm-start phase (trainer/run_folder/warmstart_progress.py)
# A rank's own exit code, when it means something to the platform (bad config,
# folder busy, lease expired): torchrun reports any failed rank as exit 1.
EXIT_CODE_FILE = "exit_code"
# The fields a `run` refused its config on (exit code 2), for the platform's run
# form to show at each field: {"errors": [[dotted path, message], ...]}.
FIELD_ERRORS_FILE = "field_errors.json"


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null so every reader can parse the line."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def checkpoint_path(run_dir: Path) -> Path:
    """Where a run keeps its checkpoint (written by trainer.run.checkpoint; a path join
    here so the platform finds it without importing torch)."""
    return run_dir / CHECKPOINT_DIR / CHECKPOINT_NAME


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def write_field_errors(run_dir: Path, errors: list[tuple[str, str]]) -> None:
    """Leave a refused config's field errors in an existing run folder (the
    platform made it); a fresh ``--out`` stays unwritten. Every rank may write
    it: the last whole copy wins."""
    if not run_dir.is_dir():
        return
    try:
        tmp = run_dir / f"{FIELD_ERRORS_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps({"errors": [list(e) for e in errors]}))
        os.replace(tmp, run_dir / FIELD_ERRORS_FILE)
    except OSError:  # an unwritable folder: the exit status and the log still say it
        pass


def read_field_errors(run_dir: Path) -> list[tuple[str, str]] | None:
    """The field errors a refused `run` left, or None (none, or unreadable)."""
    try:
        data = json.loads((run_dir / FIELD_ERRORS_FILE).read_text())
        return [(str(path), str(message)) for path, message in data["errors"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def parse_metric_lines(blob: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """(the JSON objects of the complete lines of ``blob``, the partial tail after its
    last newline): an incremental reader keeps the tail, a line still being written,
    for its next read. A complete line that is not a JSON object (torn by a crash,
    foreign) is skipped, never fatal."""
    end = blob.rfind(b"\n") + 1
    records = []
    for line in blob[:end].splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records, blob[end:]


class MetricsWriter:
    """Appends one line per step to RUN_DIR/metrics.jsonl."""

    def __init__(self, run_dir: Path, resume_from_step: int | None = None):
        self.path = run_dir / METRICS_FILE
        if resume_from_step is not None and self.path.exists():
            self.truncate_after(resume_from_step)
        elif resume_from_step is None and self.path.exists():
            self.path.unlink()
        self._fh = self.path.open("a", encoding="utf-8")

    def truncate_after(self, last_kept_step: int) -> None:
        """Keep only lines with step <= last_kept_step (and drop a torn last line)."""
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("step", -1) <= last_kept_step:
                kept.append(line)
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_metrics_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete record of a metrics.jsonl file, in order; [] when it is missing.

    A line that does not parse (the torn last line of a run still writing, or of
    one killed mid-write) is skipped, so readers can tail a live file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        packed = path.with_name(path.name + ".gz")  # a finished run, compacted
        if not packed.exists():
            return []
        text = gzip.decompress(packed.read_bytes()).decode("utf-8")
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """``read_metrics_jsonl`` of RUN_DIR/metrics.jsonl (or its compacted metrics.jsonl.gz)."""
    return read_metrics_jsonl(Path(run_dir) / METRICS_FILE)


def compact_run(run_dir: Path) -> bool:
    """Gzip a finished run's metrics.jsonl into metrics.jsonl.gz (a study's committed run
    folders: about a fifth of the bytes; every reader here reads either). Only a run
    whose summary says it succeeded (a live or stopped run keeps appending); the
    packed copy is written atomically and checked before the text is removed.
    Returns whether it compacted the folder."""
    run_dir = Path(run_dir)
    text_path = run_dir / METRICS_FILE
    if not run_succeeded(run_dir) or not text_path.exists():
        return False
    raw = text_path.read_bytes()
    packed = gzip.compress(raw, compresslevel=9, mtime=0)  # mtime 0: the same bytes each time
    if gzip.decompress(packed) != raw:
        raise OSError(f"{text_path}: the compressed copy does not read back")
    target = text_path.with_name(METRICS_FILE + ".gz")
    tmp = target.with_suffix(".gz.tmp")
    tmp.write_bytes(packed)
    os.replace(tmp, target)
    text_path.unlink()
    return True


def run_succeeded(run_dir: Path) -> bool:
    """True when the run folder's summary says it finished (a study does not rerun it)."""
    path = run_dir / SUMMARY_FILE
    return path.exists() and json.loads(path.read_text()).get("status") == "succeeded"
