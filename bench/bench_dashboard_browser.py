"""The compare page of 20 runs x 2,000 steps x 10 metrics, served and drawn for real.

Issue "Dashboards", section 5. A throwaway SQLite database is migrated and
filled through the platform's own writes (runs.lifecycle.submit_run, then
runs.metrics.ingest.ingest_metrics in the worker's batches, then the worker's
claim_run and finish_run, which keeps each finished run's metrics as
columns); then:

* server time for the chart data: the requests the page makes for its ten
  metric charts (/compare/charts: the first chart alone, then the
  other nine in one request, each one metric read) through Django's test
  client in this process, one after another, summed; median over repeats
  (target < 300 ms). For reference also the ten single-chart requests
  (/compare/chart, what a zoom or a download asks for), and both
  again with the runs as they are while training (status running, the
  chunks of steps they have moved past sealed into columns, the tail read
  from rows) and with no columns at all (step rows only, as runs finished
  before columns existed are read);
* payload: the page's chart data bodies together (target < 2 MB);
* time to first chart drawn: headless Debian chromium opens the page from a
  separate web server process (manage.py runserver, as `make up` runs it);
  from navigation start to the first chart's first Plotly draw, and to every
  chart drawn once; median over fresh browser contexts (target < 3 s).

Each measure is taken with the page as shipped (max_points=500, downsampled
keeping extremes) and without downsampling (max_points=20000 >= 2,000 steps:
every point), the browser's chart requests rewritten for the latter. The
page also draws the MoE-only charts the ten metrics leave empty and one
expert-load heatmap per run (no load vectors stored: "no data yet").

    .venv/bin/python -m bench.bench_dashboard_browser [--runs 20 --steps 2000
        --metrics 10 --repeat 5 --out bench/results/dashboard_browser.json]
    .venv/bin/python -m bench.bench_dashboard_browser \\
        --database-url postgres://postgres@127.0.0.1:5432/lab_bench_dashboard \\
        --out bench/results/dashboard_browser_pg.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench.common import Stopwatch, machine_load

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from trainer import metric_keys as mk  # noqa: E402

# The ten metrics: charts of the compare page (dashboard/charts/panels.py run_sections()).
METRICS = (
    mk.REWARD_MEAN,
    mk.REWARD_ACCURACY,
    mk.MISMATCH_KL_K1,
    mk.MISMATCH_KL_K3,
    mk.MISMATCH_EXTREME_TOKEN_FRAC,
    mk.MISMATCH_ROUTING_INCONSISTENCY,
    mk.EXPERTS_MAX_VIOLATION,
    mk.EXPERTS_ROUTER_ENTROPY,
    mk.POLICY_GRAD_NORM,
    mk.POLICY_CLIP_FRAC,
)
DOWNSAMPLED, FULL = 500, 20000  # max_points: the page's default, and "every point"
TARGETS = {"server_ms": 300.0, "payload_mb": 2.0, "first_chart_s": 3.0}
USER, PASSWORD = "bench", "pw-bench"

# Before the page's scripts: when the first chart is drawn, and when every chart is.
TIMING_JS = """
window.__firstChart = null; window.__allCharts = null; window.__drawn = new Set();
document.addEventListener('livechart:update', event => {
  const now = performance.now();
  if (window.__firstChart === null) window.__firstChart = now;
  window.__drawn.add(event.target.id);
  if (window.__allCharts === null &&
      window.__drawn.size === document.querySelectorAll('[data-live-chart]').length) {
    window.__allCharts = now;
  }
}, true);
window.__errors = [];
document.addEventListener('livechart:error', e => window.__errors.push(e.target.id + ': ' + e.detail.error), true);
"""


def _pg_admin(database_url: str, sql: str) -> None:
    import psycopg

    admin = database_url.rsplit("/", 1)[0].replace("postgres://", "postgresql://") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(sql)


def setup_django(var_dir: Path, database_url: str = "") -> dict[str, str]:
    """Settings on a fresh database (a SQLite file in var_dir unless database_url
    names a PostgreSQL one); returns the environment for a web server."""
    env = {
        "DATABASE_URL": database_url or f"sqlite:///{var_dir / 'db.sqlite3'}",
        "LAB_VAR_DIR": str(var_dir),
        "DJANGO_SETTINGS_MODULE": "lab.site.settings",
    }
    os.environ.update(env, DJANGO_DEBUG="0")  # in this process: timings without debug overhead
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    # The web server runs as `make up` runs it: DEBUG serves static files (plotly.js) itself.
    return env | {"DJANGO_DEBUG": "1"}


def synthesize(n_runs: int, n_steps: int, metrics: tuple[str, ...], seed: int = 0) -> list[int]:
    """Finished runs with noisy random-walk metrics and rare one-step spikes, stored
    the way a worker stores them. Returns the run ids."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from lab.experiments.services import create_experiment
    from lab.jobs import services as jobs
    from lab.runs import lifecycle
    from lab.runs.metrics.ingest import ingest_metrics
    from lab.runs.models import RunStatus

    user = get_user_model().objects.create_user(USER, password=PASSWORD)
    experiment = create_experiment(owner=user, name="compare benchmark", preset="moe-grpo")
    rng = np.random.default_rng(seed)
    ids = []
    for r in range(n_runs):
        run = lifecycle.submit_run(
            owner=user, experiment=experiment, preset="moe-grpo", variant=f"v{r % 4}",
            overrides={"run.seed": r, "run.steps": n_steps},
        )  # fmt: skip
        columns = {}
        for key in metrics:
            walk = np.cumsum(rng.normal(0, 0.01, n_steps)) + rng.normal(0, 0.02, n_steps)
            spikes = rng.random(n_steps) < 0.002
            walk[spikes] += rng.normal(0, 1.0, spikes.sum())
            columns[key] = walk.tolist()
        records = [{"step": s, **{k: v[s] for k, v in columns.items()}} for s in range(n_steps)]
        for start in range(0, n_steps, settings.LAB_METRICS_BATCH):
            ingest_metrics(run.pk, records[start : start + settings.LAB_METRICS_BATCH])
        # Finished as a worker finishes it: the final transition seals the metrics
        # into columns (runs.metrics.seal.seal_metrics).
        claim = jobs.claim_run(run.pk, worker_host="bench")
        jobs.finish_run(
            claim,
            status=RunStatus.SUCCEEDED,
            summary={"status": "succeeded", "steps": n_steps, "collapsed": False},
            current_step=n_steps,
        )
        ids.append(run.pk)
    return ids


def chart_urls(run_ids: list[int], metrics: tuple[str, ...], max_points: int) -> list[str]:
    """The ten single-chart requests (one metric read each)."""
    from urllib.parse import urlencode

    runs = ",".join(map(str, run_ids))
    return [
        f"/compare/chart?{urlencode({'runs': runs, 'key': k, 'max_points': max_points})}"
        for k in metrics
    ]


def group_urls(run_ids: list[int], metrics: tuple[str, ...], max_points: int) -> list[str]:
    """What the page's chart group asks for (static/dashboard/live.js LiveGroup):
    the first chart alone, the others in one request."""
    from urllib.parse import urlencode

    runs = ",".join(map(str, run_ids))
    parts = [metrics[:1], metrics[1:]] if len(metrics) > 1 else [metrics]
    return [
        "/compare/charts?"
        + urlencode({"runs": runs, "keys": ",".join(keys), "max_points": max_points})
        for keys in parts
    ]


def db_backend_pids() -> list[int]:
    """The PostgreSQL server backend of Django's connection (its CPU is part of the
    server time); none on SQLite, which runs in this thread."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return [cur.fetchone()[0]]


def server_side(run_ids: list[int], metrics: tuple[str, ...], repeat: int) -> dict[str, dict]:
    """Sequential server time (wall, and CPU: this thread's plus the database
    backend's) and payload of the page's chart data requests, and of the ten
    single-chart requests, per mode (interleaved round-robin)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(get_user_model().objects.get(username=USER))
    pids = db_backend_pids()
    modes = {"downsampled": DOWNSAMPLED, "full": FULL}
    builders = {"page": group_urls, "per_chart": chart_urls}
    times: dict[tuple[str, str], list[float]] = {(m, b): [] for m in modes for b in builders}
    cpu: dict[tuple[str, str], list[float]] = {(m, b): [] for m in modes for b in builders}
    sizes: dict[tuple[str, str], int] = {}
    for i in range(repeat + 1):  # the first round warms up
        for mode, max_points in modes.items():
            for name, build in builders.items():
                total, total_cpu, size = 0.0, 0.0, 0
                for url in build(run_ids, metrics, max_points):
                    watch = Stopwatch(pids=pids)
                    response = client.get(url)
                    spent = watch.elapsed()
                    total, total_cpu = total + spent.wall, total_cpu + spent.cpu
                    assert response.status_code == 200, response.content[:300]
                    size += len(response.content)
                if i:
                    times[mode, name].append(total)
                    cpu[mode, name].append(total_cpu)
                sizes[mode, name] = size
    return {
        mode: {
            "server_ms": 1000 * statistics.median(times[mode, "page"]),
            "server_cpu_ms": 1000 * statistics.median(cpu[mode, "page"]),
            "payload_mb": sizes[mode, "page"] / 1e6,
            "per_chart_server_ms": 1000 * statistics.median(times[mode, "per_chart"]),
            "per_chart_server_cpu_ms": 1000 * statistics.median(cpu[mode, "per_chart"]),
            "per_chart_payload_mb": sizes[mode, "per_chart"] / 1e6,
        }
        for mode in modes
    }


def server_side_other_storage(
    run_ids: list[int], metrics: tuple[str, ...], repeat: int
) -> dict[str, dict[str, dict]]:
    """``server_side`` with the runs' metrics stored as they are while training and
    before any column existed: ``training`` (status running, the chunks training
    has moved past sealed, as the worker leaves them: the tail is read from
    rows) and ``rows`` (no columns at all). The finished state is restored."""
    from django.db import transaction

    from lab.runs.metrics.seal import seal_metrics
    from lab.runs.models import MetricColumn, Run, RunStatus

    def reset(status: str) -> None:
        with transaction.atomic():
            MetricColumn.objects.filter(run_id__in=run_ids).delete()
            Run.objects.filter(pk__in=run_ids).update(status=status, metric_chunks_sealed=0)

    out = {}
    try:
        reset(RunStatus.RUNNING)
        for run_id in run_ids:
            seal_metrics(run_id)
        out["training"] = server_side(run_ids, metrics, repeat)
        reset(RunStatus.SUCCEEDED)
        out["rows"] = server_side(run_ids, metrics, repeat)
    finally:
        reset(RunStatus.SUCCEEDED)
        for run_id in run_ids:
            seal_metrics(run_id)
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_web_server(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    from lab.jobs import launch

    port = _free_port()
    proc = subprocess.Popen(
        launch.web_command("127.0.0.1", port), env=launch.process_env(env), cwd=launch.ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/accounts/login/", timeout=2).read()
            return proc, base
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("the web server exited") from None
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the web server did not start")


def _max_points_rewriter(max_points: int):
    def rewrite(route) -> None:
        url = re.sub(r"max_points=\d+", f"max_points={max_points}", route.request.url)
        route.continue_(url=url)

    return rewrite


def browser_side(base: str, run_ids: list[int], repeat: int) -> dict[str, dict]:
    """Time to the first chart drawn and to every chart drawn, per mode (fresh contexts)."""
    from tests.e2e.browser_harness import launch_chromium

    page_url = f"{base}/compare/?runs={','.join(map(str, run_ids))}"
    modes = {"downsampled": DOWNSAMPLED, "full": FULL}
    samples: dict[str, dict[str, list[float]]] = {
        m: {"first_chart_s": [], "all_charts_s": []} for m in modes
    }
    with launch_chromium() as browser:
        login = browser.new_context()
        page = login.new_page()
        page.goto(f"{base}/accounts/login/")
        page.fill("input[name=username]", USER)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r"^(?!.*/accounts/login/)"))
        state = login.storage_state()
        login.close()
        for i in range(repeat + 1):  # the first round warms up the server
            for mode, max_points in modes.items():
                context = browser.new_context(
                    storage_state=state, viewport={"width": 1280, "height": 800}
                )
                context.add_init_script(TIMING_JS)

                # Same interception in both modes, so both pay its (small) cost.
                context.route(
                    re.compile(r"/(compare/charts?|runs/\d+/heatmap)\?"),
                    _max_points_rewriter(max_points),
                )
                page = context.new_page()
                page.goto(page_url)
                try:
                    page.wait_for_function(
                        "window.__allCharts !== null",
                        timeout=int(os.environ.get("BENCH_TIMEOUT_MS", 120_000)),
                    )
                except Exception as exc:
                    state_now = page.evaluate(
                        "[window.__drawn.size, document.querySelectorAll('[data-live-chart]')"
                        ".length, window.__errors, location.href]"
                    )
                    raise RuntimeError(
                        f"charts not drawn (drawn, charts, errors, url): {state_now}"
                    ) from exc
                first, every = page.evaluate("[window.__firstChart, window.__allCharts]")
                context.close()
                if i:
                    samples[mode]["first_chart_s"].append(first / 1000)
                    samples[mode]["all_charts_s"].append(every / 1000)
    return {
        mode: {name: statistics.median(values) for name, values in by_name.items()}
        for mode, by_name in samples.items()
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--metrics", type=int, default=10, choices=range(1, len(METRICS) + 1))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--database-url",
        default="",
        help="postgres://user@host:port/NAME: database NAME is created and dropped afterwards "
        "(default: SQLite in a temporary folder)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/dashboard_browser.json")
    args = parser.parse_args(argv)
    metrics = METRICS[: args.metrics]

    postgres = args.database_url.startswith("postgres")
    load_before = machine_load()
    if postgres:
        _pg_admin(args.database_url, f'CREATE DATABASE "{args.database_url.rsplit("/", 1)[1]}"')
    try:
        with tempfile.TemporaryDirectory(prefix="lab-bench-dashboard-") as tmp:
            env = setup_django(Path(tmp), args.database_url)
            t0 = time.perf_counter()
            run_ids = synthesize(args.runs, args.steps, metrics)
            fill_s = time.perf_counter() - t0
            server = server_side(run_ids, metrics, args.repeat)
            other = server_side_other_storage(run_ids, metrics, args.repeat)
            proc, base = start_web_server(env)
            try:
                browser = browser_side(base, run_ids, args.repeat)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    finally:
        if postgres:
            from django.db import connections

            connections.close_all()
            name = args.database_url.rsplit("/", 1)[1]
            _pg_admin(args.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    rows = [
        {
            "mode": mode,
            **server[mode],
            **browser[mode],
            "training_server_ms": other["training"][mode]["server_ms"],
            "training_per_chart_server_ms": other["training"][mode]["per_chart_server_ms"],
            "rows_server_ms": other["rows"][mode]["server_ms"],
            "rows_per_chart_server_ms": other["rows"][mode]["per_chart_server_ms"],
        }
        for mode in ("downsampled", "full")
    ]
    print(
        f"database: {'PostgreSQL' if postgres else 'SQLite'}; "
        f"compare page: {args.runs} runs x {args.steps} steps x {len(metrics)} metrics "
        f"({args.runs * args.steps * len(metrics):,} points; stored in {fill_s:.1f} s), "
        f"median of {args.repeat}"
    )
    header = ["mode", "max_points", f"server ms ({len(metrics)} charts)", "payload MB", "first chart s",
              "all charts s", "per-chart requests ms", "training: server ms", "per-chart ms",
              "rows only: server ms", "per-chart ms"]  # fmt: skip
    cells = [
        [r["mode"], str(DOWNSAMPLED if r["mode"] == "downsampled" else FULL),
         f"{r['server_ms']:.0f}", f"{r['payload_mb']:.2f}", f"{r['first_chart_s']:.2f}",
         f"{r['all_charts_s']:.2f}", f"{r['per_chart_server_ms']:.0f}",
         f"{r['training_server_ms']:.0f}", f"{r['training_per_chart_server_ms']:.0f}",
         f"{r['rows_server_ms']:.0f}", f"{r['rows_per_chart_server_ms']:.0f}"]
        for r in rows
    ]  # fmt: skip
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)))
    print(
        "server CPU ms (this thread + database backend), page / per-chart: "
        + ", ".join(
            f"{r['mode']} {r['server_cpu_ms']:.0f} / {r['per_chart_server_cpu_ms']:.0f}"
            for r in rows
        )
        + f"; load average {load_before['loadavg_1m']} on {load_before['usable_cpus']} CPUs"
    )
    shipped = rows[0]
    met = {name: shipped[name] < limit for name, limit in TARGETS.items()}
    print(
        "targets (downsampled page): "
        + ", ".join(f"{n} < {TARGETS[n]:g}: {'met' if ok else 'MISSED'}" for n, ok in met.items())
    )
    results = {
        "database": "postgresql" if postgres else "sqlite",
        "runs": args.runs,
        "steps": args.steps,
        "metrics": list(metrics),
        "repeat": args.repeat,
        "store_s": fill_s,
        "rows": rows,
        "targets": TARGETS,
        "targets_met": met,
        "load_before": load_before,
        "load_after": machine_load(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
