"""MLflow log-batch ingestion into the lab's metric store (docs/benchmarks-archive.md, "MLflow
log-batch ingestion").

A verl-like stream (``--keys`` scalars a step, some under verl's own names so the
mapping runs) is posted as MLflow ``runs/log-batch`` requests of at most 1,000
points (the MLflow client's batch size) through Django's whole request path
(middleware, token auth, JSON parse, MLflow's checks, the mapping, the merge
into ``MetricStep`` under the run's lock, sealing as chunks settle), in
process, without a socket. Then every batch is posted again (a client
retrying): nothing new may be stored.

    nice -n 19 .venv/bin/python bench/bench_tracking_ingest.py [--steps 2000] [--keys 100] [--auth basic]

SQLite in a temporary folder unless DATABASE_URL names another database (which
must exist and is migrated). Wall time and this process's CPU time
(``time.process_time``; on another database its server's CPU is not in it),
with the load recorded (bench.common.machine_load).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from bench.common import machine_load  # noqa: E402

VERL_NAMES = [
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "actor/pg_clipfrac",
    "actor/entropy",
    "actor/grad_norm",
    "critic/score/mean",
    "response_length/mean",
    "timing_s/step",
]


def _stream(steps: int, keys: int) -> list[dict]:
    names = VERL_NAMES + [f"bench/key_{i:03d}" for i in range(keys - len(VERL_NAMES))]
    return [
        {
            "key": name,
            "value": (step * 31 + i) % 97 / 97.0,
            "timestamp": 1_700_000_000_000 + step,
            "step": step,
        }
        for step in range(steps)
        for i, name in enumerate(names)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=100, help="scalars per step")
    parser.add_argument("--batch", type=int, default=1000, help="points per request (MLflow: 1000)")
    parser.add_argument(
        "--auth",
        choices=("token", "basic"),
        default="token",
        help="the client's credentials: an API token, or a login (HTTP basic) checked by "
        "the production password hasher",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    load_before = machine_load()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("LAB_VAR_DIR", tmp)
        os.environ.setdefault("DATABASE_URL", f"sqlite:///{tmp}/db.sqlite3")
        results = _run(args.steps, args.keys, args.batch, args.auth)
    results["load_before"], results["load_after"] = load_before, machine_load()
    print(json.dumps(results, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


def _run(steps: int, keys: int, batch: int, auth: str = "token") -> dict:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.site.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from rest_framework.authtoken.models import Token

    from lab.runs.models import MetricStep

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="bench-password")
    if auth == "basic":
        login = base64.b64encode(b"bench:bench-password").decode()
        client = Client(HTTP_AUTHORIZATION=f"Basic {login}")
    else:
        client = Client(HTTP_AUTHORIZATION=f"Bearer {Token.objects.create(user=user).key}")

    def post(route: str, body: dict) -> dict:
        resp = client.post(
            f"/api/2.0/mlflow/{route}", json.dumps(body), content_type="application/json"
        )
        assert resp.status_code == 200, resp.content[:500]
        return resp.json()

    exp = post("experiments/create", {"name": "bench"})["experiment_id"]
    run_id = post("runs/create", {"experiment_id": exp, "run_name": "verl-like"})["run"]["info"][
        "run_id"
    ]
    points = _stream(steps, keys)
    bodies = [
        json.dumps({"run_id": run_id, "metrics": points[i : i + batch]})
        for i in range(0, len(points), batch)
    ]

    def send_all() -> tuple[float, float]:
        """(wall s, this process's CPU s): the machine is shared, so CPU time says what
        one core does and wall time what this run got."""
        t0, c0 = time.perf_counter(), time.process_time()
        for body in bodies:
            resp = client.post(
                "/api/2.0/mlflow/runs/log-batch", body, content_type="application/json"
            )
            assert resp.status_code == 200, resp.content[:500]
        return time.perf_counter() - t0, time.process_time() - c0

    # warm-up: the first request imports the URL tree (not part of ingestion)
    post("runs/log-batch", {"run_id": run_id, "metrics": []})
    first, first_cpu = send_all()
    rows = MetricStep.objects.filter(run_id=int(run_id)).count()
    stored = list(
        MetricStep.objects.filter(run_id=int(run_id), step=steps // 2).values_list(
            "values", flat=True
        )
    )
    retried, retried_cpu = send_all()
    assert MetricStep.objects.filter(run_id=int(run_id)).count() == rows == steps
    again = list(
        MetricStep.objects.filter(run_id=int(run_id), step=steps // 2).values_list(
            "values", flat=True
        )
    )
    assert again == stored and len(stored[0]) == keys
    return {
        "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
        "auth": auth,
        "steps": steps,
        "keys_per_step": keys,
        "points": len(points),
        "requests": len(bodies),
        "points_per_request": batch,
        "ingest_s": round(first, 3),
        "ingest_cpu_s": round(first_cpu, 3),
        "points_per_s": round(len(points) / first),
        "points_per_cpu_s": round(len(points) / first_cpu),
        "retry_all_s": round(retried, 3),
        "retry_points_per_s": round(len(points) / retried),
        "retry_points_per_cpu_s": round(len(points) / retried_cpu),
        "rows_after_retry": rows,
    }


if __name__ == "__main__":
    main()
