"""Server time and payload size of a compare page's chart data, with and without downsampling.

The compare page: 20 runs x 2,000 steps
x 10 metrics, one chart per metric with all runs overlaid. For each chart the
server downsamples every run's series (dashboard/charts/downsample.py), builds the
figure (dashboard/charts/figures/lines.py metric_lines) and encodes the live-update JSON
(dashboard/charts/export.py figure_payload). Targets: under 300 ms for all ten
charts, under 2 MB of JSON in all.

Also reported: the same series as plain JSON lists (what a REST client of
/api/runs/{id}/metrics would get), the other method, LTTB, and the kernels
alone on every series: the numpy minmax one, the vectorised ``downsample_many``,
and tsdownsample's MinMax and MinMaxLTTB (the latter is the LTTB kernel).

    .venv/bin/python -m bench.bench_downsample [--runs 20 --steps 2000 --metrics 10
        --max-points 500 --repeat 5 --out bench/results/downsample.json]

Timed in paired rounds (bench.common: every case once per round, rotated order,
``--repeat`` rounds), wall and thread CPU time, medians; the kernels likewise
among themselves. The load is recorded with the result; on a loaded machine
trust the CPU times.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from tsdownsample import MinMaxDownsampler

from bench.common import run_rounds
from dashboard.charts.downsample import _lttb_indices, _minmax_indices, downsample, downsample_many
from dashboard.charts.export import figure_payload
from dashboard.charts.figures import metric_lines
from dashboard.charts.style import assign_colors
from trainer import metric_keys as mk

METRICS = (
    mk.REWARD_ACCURACY,
    mk.REWARD_MEAN,
    mk.MISMATCH_KL_K3,
    mk.MISMATCH_EXTREME_TOKEN_FRAC,
    mk.MISMATCH_ROUTING_INCONSISTENCY,
    mk.EXPERTS_MAX_VIOLATION,
    mk.EXPERTS_ROUTER_ENTROPY,
    mk.POLICY_GRAD_NORM,
    mk.POLICY_CLIP_FRAC,
    mk.RESPONSE_LENGTH_MEAN,
)


def synthetic_runs(n_runs: int, n_steps: int, n_metrics: int, seed: int = 0) -> dict:
    """{metric: {run label: (steps, values)}}: noisy random walks with rare one-step spikes."""
    rng = np.random.default_rng(seed)
    keys = [
        METRICS[i % len(METRICS)] + ("" if i < len(METRICS) else f"#{i}") for i in range(n_metrics)
    ]
    steps = np.arange(n_steps)
    data: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for key in keys:
        per_run = {}
        for r in range(n_runs):
            walk = np.cumsum(rng.normal(0, 0.01, n_steps)) + rng.normal(0, 0.02, n_steps)
            spikes = rng.random(n_steps) < 0.002
            walk[spikes] += rng.normal(0, 1.0, spikes.sum())
            per_run[f"run-{r:02d}"] = (steps, walk)
        data[key] = per_run
    return data


def chart_payloads(data: dict, max_points: int | None, method: str = "minmax") -> list[str]:
    """The JSON bodies of every chart of the page (max_points None: no downsampling)."""
    colors = assign_colors(next(iter(data.values())))
    bodies = []
    for key, per_run in data.items():
        if max_points is not None:
            per_run = {
                label: downsample(x, y, max_points, method) for label, (x, y) in per_run.items()
            }
        fig = metric_lines(per_run, key.split("#")[0], colors=colors, uirevision=key)
        bodies.append(figure_payload(fig, running=True))
    return bodies


def series_lists(data: dict, max_points: int | None) -> str:
    """The same series as plain JSON lists, NaN as null."""
    out = {}
    for key, per_run in data.items():
        out[key] = {}
        for label, (x, y) in per_run.items():
            if max_points is not None:
                x, y = downsample(x, y, max_points)
            out[key][label] = {
                "steps": x.tolist(),
                "values": [None if not np.isfinite(v) else v for v in y.tolist()],
            }
    return json.dumps(out, separators=(",", ":"))


def kernel_timings(data: dict, max_points: int, repeat: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU ms to pick ``max_points`` indices of every (finite)
    series, per kernel, in paired rounds."""
    series = [(x.astype(np.int64), y) for per_run in data.values() for x, y in per_run.values()]
    ts_minmax = MinMaxDownsampler()
    kernels = {
        "numpy_minmax": lambda: [_minmax_indices(y, max_points) for _, y in series],
        "numpy_minmax_many": lambda: downsample_many(series, max_points),
        "tsdownsample_minmax": lambda: [
            ts_minmax.downsample(y, n_out=max_points) for _, y in series
        ],
        "tsdownsample_minmaxlttb": lambda: [_lttb_indices(x, y, max_points) for x, y in series],
    }
    rounds = run_rounds(kernels, repeat, warmup=1)
    return {
        name: {clock: round(rounds.median(name, clock) * 1e3, 2) for clock in ("wall", "cpu")}
        for name in kernels
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=2_000)
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--max-points", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/downsample.json"))
    args = parser.parse_args(argv)

    data = synthetic_runs(args.runs, args.steps, args.metrics)
    n_points = args.runs * args.steps * args.metrics
    results: dict[str, object] = {
        "runs": args.runs,
        "steps": args.steps,
        "metrics": args.metrics,
        "max_points": args.max_points,
        "points_in": n_points,
    }
    cases = {
        "figures_minmax": lambda: chart_payloads(data, args.max_points, "minmax"),
        "figures_lttb": lambda: chart_payloads(data, args.max_points, "lttb"),
        "figures_full": lambda: chart_payloads(data, None),
        "lists_minmax": lambda: [series_lists(data, args.max_points)],
        "lists_full": lambda: [series_lists(data, None)],
    }
    cases["downsample_only"] = lambda: [
        downsample(x, y, args.max_points) for per_run in data.values() for x, y in per_run.values()
    ]
    sizes = {}
    for name, fn in cases.items():  # once untimed: the payloads, and the warm-up
        sizes[name] = sum(len(b.encode("utf-8")) for b in fn() if isinstance(b, str))
    rounds = run_rounds(cases, args.repeat, warmup=0)
    for name in cases:
        results[name] = {
            "server_ms": round(rounds.median(name, "wall") * 1e3, 1),
            "server_cpu_ms": round(rounds.median(name, "cpu") * 1e3, 1),
            "payload_mb": round(sizes[name] / 1e6, 3),
        }
    only_downsample = results.pop("downsample_only")
    results["downsample_only_ms"] = only_downsample["server_ms"]  # type: ignore[index]
    results["downsample_only_cpu_ms"] = only_downsample["server_cpu_ms"]  # type: ignore[index]
    results["load"] = {"before": rounds.load_before, "after": rounds.load_after}
    results["cpu_states"] = rounds.cpu_states
    results["kernel_ms"] = kernel_timings(data, args.max_points, args.repeat)
    main_case = results["figures_minmax"]
    results["targets_met"] = {
        "server_under_300ms": main_case["server_ms"] < 300,  # type: ignore[index]
        "server_cpu_under_300ms": main_case["server_cpu_ms"] < 300,  # type: ignore[index]
        "payload_under_2mb": main_case["payload_mb"] < 2.0,  # type: ignore[index]
    }

    print(
        f"{args.runs} runs x {args.steps} steps x {args.metrics} metrics = {n_points:,} points,"
        f" max {args.max_points} points per series (median of {args.repeat} paired rounds)"
    )
    print(rounds.load_line())
    print(f"{'case':<16} {'server ms':>10} {'CPU ms':>8} {'payload MB':>11}")
    for name in cases:
        if name == "downsample_only":
            continue
        row = results[name]
        print(f"{name:<16} {row['server_ms']:>10.1f} {row['server_cpu_ms']:>8.1f} "  # type: ignore[index]
              f"{row['payload_mb']:>11.3f}")  # type: ignore[index]  # fmt: skip
    print(
        f"downsampling alone (minmax, {args.runs * args.metrics} series): "
        f"{only_downsample['server_ms']:.1f} ms wall, {only_downsample['server_cpu_ms']:.1f} ms CPU"  # type: ignore[index]
    )
    print(f"kernels alone ({args.runs * args.metrics} series), ms: {results['kernel_ms']}")
    print(f"targets met: {results['targets_met']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
