"""Shared timing and reporting helpers for the benchmark scripts.

The protocol every bench that compares variants follows (docs/benchmarks-archive.md,
"How the benches time"), built for a shared, loaded machine:

* Two clocks per call: wall time (``time.perf_counter``) and CPU time. CPU
  time is this thread's (``time.thread_time``, scope "thread": the work of a
  one-thread torch call runs in the calling thread, backward included) or the
  whole process's (``time.process_time``, scope "process": several torch
  threads), plus the CPU of child processes reaped during the call
  (``resource.getrusage(RUSAGE_CHILDREN)``: a trainer subprocess, torchrun and
  its ranks), plus, for work in a process that is not ours (a database
  backend, a worker: ``pids``), that process tree's CPU from /proc. Inside a
  trainer run, bench/step_clock.py gives each RL step's CPU time.
  Another process on the same cores stretches wall time but hardly
  the CPU time of the work itself, so on a loaded machine the CPU-time ratios
  are the ones to trust.
* Paired, interleaved rounds: each round runs every variant once, back to back,
  in a rotated order (A B | B A | A B ...) or a seeded random one, so a load
  spike hits every variant of its round; a comparison is the median over rounds
  of the per-round ratio, with a distribution-free (order-statistic) interval.
* The load is recorded with every result: the load average before and after,
  at each round's start, the share of all CPUs busy during the rounds
  (/proc/stat), the CPU count and the torch threads.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCOPES = ("thread", "process")
ORDERS = ("rotate", "fixed", "random")


# --- clocks


def children_cpu_s() -> float:
    """CPU seconds (user + system) of every child process reaped so far (their
    own reaped children included, so torchrun's ranks count)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _stat_cpu_s(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of ``pid`` and of its reaped children) from /proc:
    its own time from every thread's ``schedstat`` (nanoseconds on the CPU; the
    process's own ``schedstat`` is its main thread only, which leaves out a
    threaded server's request threads), falling back on ``stat``'s clock ticks
    (1/100 s: coarse for a call of a few ms); its reaped children's from ``stat``
    (ticks)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    own = (int(fields[11]) + int(fields[12])) / ticks
    try:
        threads = 0.0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                threads += int(f.read().split()[0]) / 1e9
        own = threads
    except (OSError, IndexError, ValueError):
        pass
    return int(fields[1]), own + (int(fields[13]) + int(fields[14])) / ticks


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process that is not ours to reap, e.g. a database backend
    or a worker, with all its descendants, living or reaped (a reaped one is in
    its parent's count, at clock-tick resolution). 0 when it is gone."""
    parents: dict[int, list[int]] = {}
    ppid_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid_of[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    for child, parent in ppid_of.items():
        parents.setdefault(parent, []).append(child)
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if (stat := _stat_cpu_s(p)) is not None:
            total += stat[1]
        todo += parents.get(p, [])
    return total


def own_cpu_s(scope: str = "thread") -> float:
    """CPU seconds so far of this thread or process (``scope``) and its reaped children."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, not {scope!r}")
    own = time.thread_time() if scope == "thread" else time.process_time()
    return own + children_cpu_s()


def cpu_now(scope: str = "thread", pids: Sequence[int] = ()) -> float:
    """``own_cpu_s`` plus the process trees of ``pids`` (processes that are not
    ours: a database server's backend, a worker)."""
    return own_cpu_s(scope) + sum(tree_cpu_s(p) for p in pids)


@dataclass(frozen=True)
class Timing:
    """Seconds of one call: wall and CPU."""

    wall: float
    cpu: float


class Stopwatch:
    """Both clocks from construction (or ``restart``) to ``elapsed`` (``cpu_now``)."""

    def __init__(self, scope: str = "thread", pids: Sequence[int] = ()) -> None:
        self.scope, self.pids = scope, tuple(pids)
        self.restart()

    def restart(self) -> None:
        # Other processes first, this one last (and the reverse in ``elapsed``):
        # scanning /proc for them is not charged to the call.
        others = sum(tree_cpu_s(p) for p in self.pids)
        self._wall, self._cpu = time.perf_counter(), own_cpu_s(self.scope) + others

    def elapsed(self) -> Timing:
        wall, own = time.perf_counter() - self._wall, own_cpu_s(self.scope)
        others = sum(tree_cpu_s(p) for p in self.pids)
        return Timing(wall, own + others - self._cpu)


def measure(
    fn: Callable[[], object], scope: str = "thread", pids: Sequence[int] = ()
) -> tuple[Timing, object]:
    """One call of ``fn``: its wall and CPU seconds, and what it returned."""
    watch = Stopwatch(scope, pids)
    result = fn()
    return watch.elapsed(), result


def median_device_seconds(
    fn: Callable[[], object], device, repeats: int, warmups: int = 2
) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn`` after ``warmups`` untimed
    ones, each call between two ``trainer.devices.run_mode.phase_clock`` reads (the
    device synchronised on CUDA: kernels are asynchronous). For GPU checks, where
    the host's CPU time says nothing about the device's."""
    from trainer.devices.run_mode import phase_clock

    for _ in range(warmups):
        fn()
    samples = []
    for _ in range(repeats):
        start = phase_clock(device)
        fn()
        samples.append(phase_clock(device) - start)
    return statistics.median(samples)


def set_threads(threads: int = 1) -> int:
    """torch's intra-op threads (1 unless a bench is about threads); returns it."""
    import torch

    torch.set_num_threads(threads)
    return torch.get_num_threads()


def cpu_jiffies() -> dict[str, int]:
    """The machine's CPU time so far by state (first line of /proc/stat; empty
    where there is none): user, nice, system, idle, iowait, irq, softirq, steal."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except OSError:
        return {}
    states = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return dict(zip(states, values, strict=False))


def busy_share(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Share of all CPUs' time between two ``cpu_jiffies`` readings that was busy
    (anything but idle and iowait: this process, its neighbours) and stolen by
    the hypervisor."""
    delta = {k: after[k] - before[k] for k in before if k in after}
    total = sum(delta.values())
    if not total:
        return {}
    idle = delta.get("idle", 0) + delta.get("iowait", 0)
    return {
        "busy_share": round(1 - idle / total, 3),
        "steal_share": round(delta.get("steal", 0) / total, 3),
    }


def machine_load() -> dict[str, object]:
    """What else the machine was doing: load averages, CPUs, torch threads."""
    one, five, fifteen = os.getloadavg()
    cpus = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    torch = sys.modules.get("torch")
    return {
        "loadavg_1m": round(one, 2),
        "loadavg_5m": round(five, 2),
        "loadavg_15m": round(fifteen, 2),
        "cpus": cpus,
        "usable_cpus": usable,
        "load_per_cpu": round(one / usable, 2),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
    }


# --- statistics


def _binomial_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def median_interval(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float]:
    """Order-statistic interval for the median: (low, high, coverage).

    The widest-rank pair (x_(j), x_(n+1-j)) whose coverage 1 - 2 P(X <= j - 1),
    X ~ Binomial(n, 1/2), is at least ``confidence``; with too few values for
    that (under 6 at 95%) the range (min, max) and its smaller coverage."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("no values")
    j = 1
    while j + 1 <= (n + 1) // 2 and 1 - 2 * _binomial_cdf(j, n) >= confidence:
        j += 1
    coverage = 1 - 2 * _binomial_cdf(j - 1, n) if n > 1 else 0.0
    return xs[j - 1], xs[n - j], coverage


@dataclass(frozen=True)
class Ratio:
    """Median over rounds of numerator_i / denominator_i, with its interval."""

    median: float
    low: float
    high: float
    coverage: float
    n: int

    def __str__(self) -> str:
        return f"{self.median:.3f} [{self.low:.3f}, {self.high:.3f}]"

    def as_dict(self) -> dict[str, float]:
        return {
            "median": round(self.median, 4),
            "low": round(self.low, 4),
            "high": round(self.high, 4),
            "coverage": round(self.coverage, 3),
            "rounds": self.n,
        }


def ratio_stats(
    numerator: Sequence[float], denominator: Sequence[float], confidence: float = 0.95
) -> Ratio:
    """Paired ratio of two variants timed in the same rounds."""
    ratios = [a / b for a, b in zip(numerator, denominator, strict=True)]
    low, high, coverage = median_interval(ratios, confidence)
    return Ratio(statistics.median(ratios), low, high, coverage, len(ratios))


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """Median over rounds of numerator[i] / denominator[i]."""
    return ratio_stats(numerator, denominator).median


# --- rounds


def round_orders(
    names: Sequence[str], rounds: int, order: str = "rotate", seed: int = 0
) -> list[list[str]]:
    """The order of the variants in each round: "rotate" starts round i at
    variant i (A B | B A | A B ... for two), "fixed" keeps A B every round,
    "random" shuffles each round with a seeded generator."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
    names = list(names)
    rng = random.Random(seed)
    out = []
    for i in range(rounds):
        if order == "fixed":
            out.append(list(names))
        elif order == "rotate":
            k = i % len(names)
            out.append(names[k:] + names[:k])
        else:
            shuffled = list(names)
            rng.shuffle(shuffled)
            out.append(shuffled)
    return out


@dataclass
class Rounds:
    """Timings of variants in paired rounds, and the load they ran under."""

    names: list[str]
    scope: str = "thread"
    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    orders: list[list[str]] = field(default_factory=list)
    round_load: list[float] = field(default_factory=list)
    load_before: dict[str, object] = field(default_factory=machine_load)
    load_after: dict[str, object] | None = None
    cpu_states: dict[str, float] = field(default_factory=dict)
    _jiffies: dict[str, int] = field(default_factory=cpu_jiffies, repr=False)

    def __post_init__(self) -> None:
        for name in self.names:
            self.wall.setdefault(name, [])
            self.cpu.setdefault(name, [])

    def begin_round(self, order: Sequence[str]) -> None:
        self.orders.append(list(order))
        self.round_load.append(round(os.getloadavg()[0], 2))

    def add(self, name: str, timing: Timing) -> None:
        self.wall[name].append(timing.wall)
        self.cpu[name].append(timing.cpu)

    def finish(self) -> Rounds:
        """Records the load after the rounds and the machine's busy share during them."""
        self.load_after = machine_load()
        self.cpu_states = busy_share(self._jiffies, cpu_jiffies())
        return self

    def samples(self, name: str, clock: str = "cpu") -> list[float]:
        if clock not in ("wall", "cpu"):
            raise ValueError(f"clock must be 'wall' or 'cpu', not {clock!r}")
        return (self.cpu if clock == "cpu" else self.wall)[name]

    def median(self, name: str, clock: str = "cpu") -> float:
        return statistics.median(self.samples(name, clock))

    def ratio(self, numerator: str, denominator: str, clock: str = "cpu") -> Ratio:
        return ratio_stats(self.samples(numerator, clock), self.samples(denominator, clock))

    def rows(self, baseline: str | None = None, scale: float = 1e3) -> list[dict[str, object]]:
        """One row per variant: medians (ms by default) and, against ``baseline``,
        the paired ratios in wall and CPU time with their intervals."""
        rows = []
        for name in self.names:
            row: dict[str, object] = {
                "variant": name,
                "wall_ms": round(self.median(name, "wall") * scale, 3),
                "cpu_ms": round(self.median(name, "cpu") * scale, 3),
            }
            if baseline is not None:
                row["x_wall"] = str(self.ratio(name, baseline, "wall"))
                row["x_cpu"] = str(self.ratio(name, baseline, "cpu"))
            rows.append(row)
        return rows

    def record(self, baseline: str | None = None) -> dict[str, object]:
        """Everything as JSON: samples, medians, paired ratios, orders, load."""
        out: dict[str, object] = {
            "scope": self.scope,
            "rounds": len(self.orders),
            "orders": self.orders,
            "load_before": self.load_before,
            "load_after": self.load_after,
            "round_loadavg_1m": self.round_load,
            "cpu_states": self.cpu_states,
            "wall_s": self.wall,
            "cpu_s": self.cpu,
            "median_wall_s": {n: self.median(n, "wall") for n in self.names},
            "median_cpu_s": {n: self.median(n, "cpu") for n in self.names},
        }
        if baseline is not None:
            out["baseline"] = baseline
            out["ratio_wall"] = {n: self.ratio(n, baseline, "wall").as_dict() for n in self.names}
            out["ratio_cpu"] = {n: self.ratio(n, baseline, "cpu").as_dict() for n in self.names}
        return out

    def load_line(self) -> str:
        before, after = self.load_before, self.load_after or machine_load()
        busy = self.cpu_states.get("busy_share")
        return (
            f"load average {before['loadavg_1m']} -> {after['loadavg_1m']} "
            f"(rounds {min(self.round_load, default=0)}-{max(self.round_load, default=0)}) "
            f"on {before['usable_cpus']} usable CPUs"
            + (f", all CPUs {100 * busy:.0f}% busy" if busy is not None else "")
            + f", torch threads {before['torch_threads']}, CPU time scope: {self.scope}"
        )


def run_rounds(
    fns: dict[str, Callable[[], object]],
    rounds: int = 15,
    warmup: int = 1,
    order: str = "rotate",
    seed: int = 0,
    scope: str = "thread",
    orders: Iterable[Sequence[str]] | None = None,
    pids: Sequence[int] = (),
) -> Rounds:
    """Time every function once per round, in paired rounds (``round_orders``),
    after ``warmup`` untimed calls of each; ``pids``: see ``cpu_now``."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    label = scope + (f" + process trees {list(pids)}" if pids else "")
    result = Rounds(list(fns), scope=label)
    for round_order in orders if orders is not None else round_orders(fns, rounds, order, seed):
        result.begin_round(round_order)
        for name in round_order:
            result.add(name, measure(fns[name], scope, pids)[0])
    return result.finish()


# --- reporting


def environment() -> dict[str, object]:
    import torch

    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "load": machine_load(),
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
