"""bench/common.py's timing protocol on hand-made timings: paired ratios and
their interval, the order of the rounds, the two clocks and the recorded load."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from bench.common import (
    Rounds,
    Stopwatch,
    Timing,
    busy_share,
    measure,
    median_interval,
    ratio_stats,
    round_orders,
    run_rounds,
)


def test_paired_ratio_recovers_a_known_ratio_under_load_spikes():
    # B costs 2x A; two rounds hit by a 10x load spike that the ratio of the
    # two medians would not cancel if the spikes fell on one side only.
    a = [1.0, 1.0, 10.0, 1.0, 10.0, 1.0, 1.0]
    b = [2 * x for x in a]
    ratio = ratio_stats(b, a)
    assert ratio.median == pytest.approx(2.0)
    assert ratio.low == pytest.approx(2.0) and ratio.high == pytest.approx(2.0)
    assert ratio.n == 7


def test_paired_ratio_interval_brackets_the_median():
    a = [1.0] * 9
    b = [1.9, 2.0, 2.1, 1.8, 2.2, 2.0, 1.95, 2.05, 3.5]  # one outlier round
    ratio = ratio_stats(b, a)
    assert ratio.median == pytest.approx(2.0)
    assert 1.8 <= ratio.low <= ratio.median <= ratio.high < 3.5  # the outlier is cut
    assert ratio.coverage >= 0.95


def test_median_interval_order_statistics():
    # n = 20 at 95%: the 6th and 15th values, coverage 1 - 2 P(Bin(20, 1/2) <= 5) = 0.9586
    low, high, coverage = median_interval(list(range(1, 21)))
    assert (low, high) == (6, 15)
    assert coverage == pytest.approx(0.9586, abs=1e-4)
    # Too few values for 95%: the range, with the coverage it really has.
    low, high, coverage = median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (low, high) == (1.0, 5.0)
    assert coverage == pytest.approx(1 - 2 / 32)


def test_rotated_order_alternates_and_covers_every_variant_each_round():
    orders = round_orders(["A", "B"], 4, "rotate")
    assert orders == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    flat = [name for order in round_orders(["A", "B"], 3, "fixed") for name in order]
    assert flat == ["A", "B", "A", "B", "A", "B"]
    three = round_orders(["A", "B", "C"], 3, "rotate")
    assert [o[0] for o in three] == ["A", "B", "C"]  # every variant leads once
    random_orders = round_orders(["A", "B", "C"], 5, "random", seed=1)
    assert all(sorted(o) == ["A", "B", "C"] for o in random_orders)
    assert random_orders == round_orders(["A", "B", "C"], 5, "random", seed=1)
    with pytest.raises(ValueError):
        round_orders(["A"], 1, "sorted")


def test_run_rounds_interleaves_the_calls_and_records_the_load():
    calls: list[str] = []
    fns = {"A": lambda: calls.append("A"), "B": lambda: calls.append("B")}
    timed = run_rounds(fns, rounds=4, warmup=1)
    assert calls[:2] == ["A", "B"]  # the warm-up, once each
    assert calls[2:] == ["A", "B", "B", "A", "A", "B", "B", "A"]
    assert timed.orders == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    assert len(timed.wall["A"]) == len(timed.cpu["B"]) == 4
    for load in (timed.load_before, timed.load_after):
        assert {"loadavg_1m", "cpus", "usable_cpus", "torch_threads"} <= set(load)
    assert len(timed.round_load) == 4
    record = timed.record(baseline="A")
    json.dumps(record)  # results are written as JSON
    assert record["ratio_cpu"]["A"]["median"] == pytest.approx(1.0)
    assert "load average" in timed.load_line()


def test_rounds_ratios_come_from_the_same_rounds():
    timed = Rounds(["fast", "slow"])
    for i, load in enumerate([1.0, 5.0, 1.0, 3.0, 1.0]):
        timed.begin_round(["fast", "slow"] if i % 2 == 0 else ["slow", "fast"])
        timed.add("fast", Timing(wall=load * 0.1, cpu=0.1))
        timed.add("slow", Timing(wall=load * 0.3, cpu=0.3))
    timed.finish()
    assert timed.ratio("slow", "fast", "wall").median == pytest.approx(3.0)
    assert timed.ratio("slow", "fast", "cpu").median == pytest.approx(3.0)
    assert timed.median("fast", "wall") == pytest.approx(0.1)
    rows = timed.rows(baseline="fast")
    assert rows[1]["variant"] == "slow" and rows[1]["x_cpu"].startswith("3.000")
    with pytest.raises(ValueError):
        timed.samples("fast", "gpu")


def test_cpu_clock_leaves_out_sleep_and_counts_child_processes():
    spent, _ = measure(lambda: time.sleep(0.2))
    assert spent.wall >= 0.2 and spent.cpu < 0.1
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    spent, _ = measure(lambda: subprocess.run([sys.executable, "-c", burn], check=True))
    assert spent.cpu >= 0.29  # the child's CPU, reaped during the call


def test_cpu_clock_counts_a_process_it_does_not_reap():
    # Start-up first (maybe before the stopwatch starts), then 0.3 s of CPU, then idle.
    burn = "import time\ntime.sleep(0.5)\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    proc = subprocess.Popen([sys.executable, "-c", f"{burn}\ntime.sleep(30)"])
    try:
        watch = Stopwatch(pids=[proc.pid])
        deadline = time.time() + 60
        while watch.elapsed().cpu < 0.29 and time.time() < deadline:
            time.sleep(0.05)
        assert watch.elapsed().cpu >= 0.29
    finally:
        proc.kill()
        proc.wait()


def _burn(seconds: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


@pytest.mark.slow  # imports the trainer's run loop
def test_step_clock_times_every_step_and_phase(monkeypatch):
    from bench.step_clock import StepClock
    from trainer.run import runner

    def fake_step(ctx, step):  # the loop step's shape: four phase stamps
        for _ in range(4):
            runner.phase_clock(None)
            _burn(0.02)
        return {"step": step}

    monkeypatch.setattr(runner, "_rl_step", fake_step)
    monkeypatch.setattr(runner, "phase_clock", lambda device: time.perf_counter())
    with StepClock() as clock:
        assert runner._rl_step(None, 3) == {"step": 3}
    assert runner._rl_step is fake_step  # restored on exit
    (record,) = clock.steps
    assert record["cpu_s"] >= 0.079
    for phase in ("rollout", "mismatch", "update"):
        assert 0.019 <= record[f"{phase}_cpu_s"] < record["cpu_s"]


def test_busy_share_from_cpu_state_counters():
    before = {"user": 100, "nice": 0, "system": 50, "idle": 800, "iowait": 50, "steal": 0}
    after = {"user": 160, "nice": 0, "system": 70, "idle": 900, "iowait": 50, "steal": 20}
    # busy = 60 + 20 + 20 (steal) of 200 jiffies
    assert busy_share(before, after) == {"busy_share": 0.5, "steal_share": 0.1}
    assert busy_share(before, before) == {}
