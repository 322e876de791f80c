"""A study that fits a time slot: how many runs fit (the plan), from measured rows.

A GPU is lent for minutes at a time, each time on a bare machine. ``trainer
study NAME --budget-s S`` runs what fits in S seconds and stops cleanly: a run in
progress at the deadline ends at a step boundary with a checkpoint (status
``stopped``, resumed by the next sitting), a run that would not get far enough
to be worth its start is not started. ``--dry`` (or ``--budget-s`` itself,
before it starts) prints the plan: how many runs finish, how many stop at a
checkpoint, how many are not started, from

* measured rows (``StepRow``): a variant's median step time and a run's start
  cost (process, model, initial evaluation) on a kind of device. They come from
  the study folder's own runs (their metrics and summaries, and
  ``sittings.jsonl``, which each sitting appends to) and from the rows shipped
  in ``trainer/studies/measured/step_times.json`` (measured on the machines a study has
  run on; a study folder's rows are ``trainer study NAME --out OUT --rows``);
* packed runs: with P runs at once on one GPU the aggregate rate is the single
  run's times the measured speedup of P packed runs (the device check's
  ``packed`` row, in the same file); without a measured speedup the plan assumes
  none (P runs share the device's one run's rate), the cautious reading;
* bases: each base to train costs its measured warm start; an imported base
  (``--bases``) costs nothing.

The plan simulates the study's own schedule: bases first (P at a time), then the
runs in their order, each to the earliest free process.
"""

from __future__ import annotations

import heapq
import json
import os
import shutil
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from trainer import metric_keys as K
from trainer.run_folder.files import SUMMARY_FILE, read_metrics

ROWS_FILE = "step_times.json"
SITTINGS_FILE = "sittings.jsonl"
# Seconds kept at the end of a budget for the report and the last checkpoints.
REPORT_RESERVE_S = 15.0
# A run is started only when this many of its steps fit before the deadline.
MIN_STEPS_TO_START = 3


@dataclass
class StepRow:
    """One measurement: on ``device``, a run of ``variant`` of ``study`` takes
    ``step_s`` per RL step and ``start_s`` before its first step."""

    device: str
    study: str
    variant: str
    step_s: float
    start_s: float | None = None
    warm_start_s: float | None = None
    packed: int = 1  # processes sharing the device when it was measured
    source: str = ""


@dataclass
class Job:
    variant: str
    seed: int
    steps_left: int
    base: str  # the base's config hash


@dataclass
class Plan:
    device: str
    budget_s: float
    parallel: int
    speedup: float
    speedup_source: str
    bases_to_train: int
    bases_imported: int
    finish: list[Job] = field(default_factory=list)
    stop: list[Job] = field(default_factory=list)
    not_started: list[Job] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # variants without a measured row
    warm_start_s: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "budget_s": self.budget_s,
            "parallel": self.parallel,
            "packed_speedup": self.speedup,
            "speedup_source": self.speedup_source,
            "bases_to_train": self.bases_to_train,
            "bases_imported": self.bases_imported,
            "finish": len(self.finish),
            "stop_at_checkpoint": len(self.stop),
            "not_started": len(self.not_started),
            "unknown_variants": self.unknown,
            "row_sources": self.sources,
        }

    def text(self) -> str:
        lines = [
            f"plan on {self.device}, budget {self.budget_s:.0f} s, {self.parallel} at a time "
            f"(packed speedup {self.speedup:.2f}: {self.speedup_source})",
            f"  bases: {self.bases_imported} imported, {self.bases_to_train} to train"
            + (f" ({self.warm_start_s:.0f} s each)" if self.warm_start_s else ""),
            f"  runs: {len(self.finish)} finish, {len(self.stop)} stop at a checkpoint "
            f"(resumed next time), {len(self.not_started)} not started",
        ]
        lines += [f"  step time of {v}: {src}" for v, src in sorted(self.sources.items())]
        if self.bases_to_train and not self.warm_start_s:
            lines.append(f"  no measured warm start on {self.device}: bases counted as free")
        if self.unknown:
            lines.append(
                f"  no measured step time on {self.device} for {', '.join(self.unknown)}: "
                "those runs are counted as not started (the plan cannot say); a sitting "
                "measures them"
            )
        return "\n".join(lines)


def device_kind(run_device: str = "auto") -> str:
    """The kind of device a study here runs on, without creating a CUDA context:
    the GPU's name from ``nvidia-smi`` (``NVIDIA H200``), else ``cpu``."""
    if run_device != "cpu" and shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            )
            names = [n.strip() for n in done.stdout.splitlines() if n.strip()]
            if names:
                return names[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return "cpu"


def shipped_rows() -> list[dict[str, Any]]:
    text = resources.files("trainer.studies").joinpath("measured", ROWS_FILE).read_text()
    return json.loads(text)["rows"]


def folder_rows(study: str, out: Path) -> list[StepRow]:
    """Rows from a study folder: per variant and device, the median over its runs of
    each run's median ``time/step_s`` (the device its summary names, the packing its
    memory share implies), and from ``sittings.jsonl`` the median start cost of a
    run (its seconds outside RL steps) and of a base's warm start."""
    steps: dict[tuple[str, str], list[float]] = {}
    packed: dict[tuple[str, str], int] = {}
    for summary_path in sorted(out.glob(f"*/seed*/{SUMMARY_FILE}")):
        run_dir = summary_path.parent
        try:
            summary = json.loads(summary_path.read_text())
            times = [r[K.TIME_STEP_S] for r in read_metrics(run_dir) if r.get(K.TIME_STEP_S)]
        except (OSError, ValueError):
            continue
        if times:
            record = summary.get("device") or {}
            key = (record.get("name") or "cpu", run_dir.parent.name)
            steps.setdefault(key, []).append(statistics.median(times))
            share = record.get("memory_share")
            packed[key] = round(1 / share) if share else 1
    starts: dict[tuple[str, str], list[float]] = {}
    warm: dict[str, list[float]] = {}
    for sitting in read_sittings(out):
        for run in sitting.get("runs", []):
            if run.get("start_s") is not None:
                starts.setdefault((sitting["device"], run["variant"]), []).append(run["start_s"])
        for base in sitting.get("bases", []):
            if base.get("how") == "trained here" and base.get("seconds"):
                warm.setdefault(sitting["device"], []).append(base["seconds"])
    return [
        StepRow(
            device,
            study,
            variant,
            statistics.median(values),
            start_s=_median(starts.get((device, variant), [])),
            warm_start_s=_median(warm.get(device, [])),
            packed=packed[(device, variant)],
            source=f"{len(values)} runs in {out}",
        )
        for (device, variant), values in sorted(steps.items())
    ]


def merge_rows(rows: list[StepRow], path: Path) -> int:
    """Put ``rows`` into the rows file ``path`` (replacing rows of the same device,
    study and variant); returns how many it holds."""
    data = json.loads(path.read_text())
    fresh = {(r.device, r.study, r.variant) for r in rows}
    kept = [
        r for r in data["rows"] if (r.get("device"), r.get("study"), r.get("variant")) not in fresh
    ]
    data["rows"] = kept + [{"kind": "step", **asdict(r)} for r in rows]
    path.write_text(json.dumps(data, indent=2) + "\n")
    return len(data["rows"])


def read_sittings(out: Path) -> list[dict[str, Any]]:
    path = out / SITTINGS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return statistics.median(values) if values else None


def plan(
    study: str,
    jobs: list[Job],
    device: str,
    budget_s: float,
    parallel: int,
    bases_to_train: set[str],
    bases_imported: int,
    rows: list[StepRow],
    shipped: list[dict[str, Any]] | None = None,
) -> Plan:
    """How many of ``jobs`` (in the order the study runs them) finish in ``budget_s``
    on ``device`` with ``parallel`` processes (module docstring)."""
    shipped = shipped_rows() if shipped is None else shipped
    fields = set(StepRow.__dataclass_fields__)
    rows = rows + [
        StepRow(**{k: v for k, v in r.items() if k in fields})
        for r in shipped
        if r.get("kind", "step") == "step"
    ]
    mine = [r for r in rows if r.device == device and r.study == study]
    speedup, speedup_source = packed_speedup(shipped, device, parallel)
    result = Plan(
        device, budget_s, parallel, speedup, speedup_source, len(bases_to_train), bases_imported
    )

    def slowdown(processes: int) -> float:
        """A packed run's step time over a lone run's, with ``processes`` at once."""
        return processes / packed_speedup(shipped, device, processes)[0]

    step_of, start_of = {}, {}
    for variant in sorted({j.variant for j in jobs}):
        measured = [r for r in mine if r.variant == variant]
        # each row's step time as a lone run's (rows measured while packed are slower)
        step = _median([r.step_s / slowdown(r.packed) for r in measured])
        if step is None:
            result.unknown.append(variant)
            continue
        step_of[variant] = step
        start_of[variant] = (
            _median([r.start_s for r in measured]) or _median([r.start_s for r in mine]) or 0.0
        )
        result.sources[variant] = f"{step:.3f} s/step, start {start_of[variant]:.0f} s, " + (
            measured[0].source
        )
    warm = result.warm_start_s = _median([r.warm_start_s for r in mine]) or 0.0
    # Each of P packed processes steps at the lone run's rate x speedup / P.
    slow = slowdown(parallel)
    deadline = budget_s - REPORT_RESERVE_S
    free = [0.0] * max(1, parallel)
    for i in range(len(bases_to_train)):  # bases first, P at a time
        free[i % len(free)] += warm * slow
    heapq.heapify(free)
    for job in jobs:
        if job.variant not in step_of:
            result.not_started.append(job)
            continue
        begin = heapq.heappop(free)
        step = step_of[job.variant] * slow
        cost = start_of[job.variant] + job.steps_left * step
        if begin + start_of[job.variant] + MIN_STEPS_TO_START * step > deadline:
            result.not_started.append(job)
            heapq.heappush(free, begin)
            continue
        (result.finish if begin + cost <= deadline else result.stop).append(job)
        heapq.heappush(free, min(begin + cost, deadline))
    return result


def packed_speedup(shipped: list[dict[str, Any]], device: str, parallel: int) -> tuple[float, str]:
    """The measured aggregate speedup of ``parallel`` packed runs on ``device`` (the
    largest measured count at or below it), 1.0 when none was measured."""
    if parallel <= 1:
        return 1.0, "one run at a time"
    if device == "cpu":  # one thread per run, each on a core of its own while they last
        cores = os.cpu_count() or 1
        return float(min(parallel, cores)), f"{cores} CPU cores, one run per core"
    rows = [r for r in shipped if r.get("kind") == "packed" and r.get("device") == device]
    best = None
    for row in rows:
        for count, speedup in row.get("speedup", {}).items():
            if int(count) <= parallel and (best is None or int(count) > best[0]):
                best = (int(count), float(speedup), row.get("source", ""))
    if best is None:
        return 1.0, f"no packed-runs row for {device}: assumed none"
    return best[1], f"{best[0]} packed runs measured {best[1]:.2f}x, {best[2]}"
