"""One Idempotency-Key, one request, one run (or sweep): the database's unique
(owner, key) decides between racing requests, and a request that loses the race
gets the stored run only if it asked for the same one (a 422 otherwise), never
the other request's run. Concurrent requests go to a real server (gunicorn, its
worker threads) on this suite's database, SQLite or PostgreSQL."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from lab_processes import LabStack

from lab.experiments.models import Sweep
from lab.runs.models import Run

# What the database itself decides (docs/design.md 4): also run on PostgreSQL.
pytestmark = pytest.mark.database

BODIES = [
    {"preset": "moe-grpo", "overrides": {"run.steps": 3}},
    {"preset": "moe-grpo", "overrides": {"run.steps": 4}},
]
SWEEPS = [
    {"preset": "moe-grpo", "grid": {"run.steps": [3, 4]}, "seeds": [0]},
    {"preset": "moe-grpo", "grid": {"run.steps": [5, 6]}, "seeds": [0]},
]


def test_sequential_reuse_of_a_key_for_a_sweep(api, experiment):
    headers = {"HTTP_IDEMPOTENCY_KEY": "sweep-1"}
    body = {"experiment": experiment.pk, **SWEEPS[0]}
    first = api.post("/api/sweeps", body, format="json", **headers)
    again = api.post("/api/sweeps", body, format="json", **headers)
    assert (first.status_code, again.status_code) == (201, 200), again.content
    assert again.json()["id"] == first.json()["id"]
    other = api.post(
        "/api/sweeps", {"experiment": experiment.pk, **SWEEPS[1]}, format="json", **headers
    )
    assert other.status_code == 422, other.content
    assert f"sweep {first.json()['id']}" in other.json()["errors"]["Idempotency-Key"][0]
    assert Sweep.objects.count() == 1 and Run.objects.count() == 2
    # no key: a new sweep every time
    assert api.post("/api/sweeps", body, format="json").status_code == 201
    assert Sweep.objects.count() == 2


def _race(stack: LabStack, path: str, bodies: list[dict], key: str, n: int = 10):
    """``n`` requests at once, alternating the two bodies, all with ``key``."""
    barrier = threading.Barrier(n)
    results: list[tuple[int, int, dict]] = [None] * n  # type: ignore[list-item]

    def send(i: int) -> None:
        body = bodies[i % 2]
        request = urllib.request.Request(
            f"http://127.0.0.1:{stack.port}{path}", json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Token {stack.token}", "Content-Type": "application/json",
                     "Idempotency-Key": key},
        )  # fmt: skip
        barrier.wait()
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                results[i] = (i % 2, response.status, json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            results[i] = (i % 2, exc.code, json.loads(exc.read() or b"{}"))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.e2e
@pytest.mark.slow
def test_concurrent_requests_with_one_key_store_one_run_and_one_sweep(tmp_path):
    stack = LabStack(tmp_path, "filesystem")
    try:
        experiment = stack.post("/api/experiments", {"name": "race", "preset": "moe-grpo"})["id"]
        for trial in range(3):
            bodies = [{"experiment": experiment, "queue": stack.queue, **b} for b in BODIES]
            results = _race(stack, "/api/runs", bodies, f"run-key-{trial}")
            stored = {r["id"] for _, code, r in results if code in (200, 201)}
            assert len(stored) == 1, results
            run = stack.run(stored.pop())
            winner = run["config"]["run"]["steps"]
            for body, code, answer in results:
                asked = BODIES[body]["overrides"]["run.steps"]
                if code in (200, 201):
                    assert asked == winner, (body, code, answer)  # never the other body's run
                else:
                    assert code == 422 and asked != winner, (body, code, answer)
            assert sum(code == 201 for _, code, _ in results) == 1
            sweep_bodies = [{"experiment": experiment, "queue": stack.queue, **b} for b in SWEEPS]
            results = _race(stack, "/api/sweeps", sweep_bodies, f"sweep-key-{trial}")
            created = {r["id"] for _, code, r in results if code in (200, 201)}
            assert len(created) == 1, results
            assert sum(code == 201 for _, code, _ in results) == 1
            assert all(code in (200, 201, 422) for _, code, _ in results), results
        runs = stack.get(f"/api/runs?experiment={experiment}&limit=100")["count"]
        assert runs == 3 + 3 * 2  # one run per run-key, two per sweep-key
    finally:
        stack.close()
