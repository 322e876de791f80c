"""Shared timing and reporting helpers for the benchmark scripts."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def time_interleaved(
    fns: dict[str, Callable[[], object]], warmup: int = 3, repeats: int = 15
) -> dict[str, float]:
    """Median seconds per call of each function.

    Calls are interleaved round-robin (a, b, c, a, b, c, ...) so that load
    from other processes on a shared machine hits every variant alike.
    """
    samples = time_interleaved_samples(fns, warmup, repeats)
    return {name: statistics.median(ts) for name, ts in samples.items()}


def time_interleaved_samples(
    fns: dict[str, Callable[[], object]], warmup: int = 3, repeats: int = 15
) -> dict[str, list[float]]:
    """Seconds of every call, ``repeats`` round-robin rounds per function."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return samples


def paired_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median over rounds of numerator[i] / denominator[i].

    Calls of one round-robin round run back to back, so their ratio cancels
    most of the slowly drifting load of a shared machine that the ratio of
    two medians keeps.
    """
    return statistics.median(n / d for n, d in zip(numerator, denominator, strict=True))


def environment() -> dict[str, object]:
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def print_table(rows: list[dict[str, object]], columns: list[str]) -> None:
    def fmt(value: object) -> str:
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    cells = [[fmt(row.get(col, "")) for col in columns] for row in rows]
    widths = [max(len(col), *(len(c[i]) for c in cells)) for i, col in enumerate(columns)]
    print("  ".join(col.ljust(w) for col, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def write_results(name: str, payload: dict[str, object]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"environment": environment(), **payload}
    path.write_text(json.dumps(payload, indent=2))
    return path
