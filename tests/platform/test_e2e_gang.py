"""A run over two workers ("nodes" of one gloo rank each) through the real
queue on Redis: gang-scheduled, joined by torchrun's c10d rendezvous, trained
to the end; then a member worker killed mid-run: the run resumes on a new gang
from its checkpoint and every metric step is stored exactly once."""

from __future__ import annotations

import pytest
from lab_processes import TINY_OVERRIDES, LabStack, redis_ok

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def redis_stack(tmp_path):
    if not redis_ok():
        pytest.skip("no Redis")
    stack = LabStack(tmp_path, "redis")
    # Both "hosts" are this machine; the gang gets a minute to assemble.
    stack.env.update(LAB_RDZV_HOST="127.0.0.1", LAB_GANG_TIMEOUT_S="60")
    try:
        yield stack
    finally:
        stack.close()


def _submit_gang(stack, steps: int) -> dict:
    exp = stack.post("/api/experiments", {"name": "gang", "preset": "moe-grpo"})
    overrides = {
        **TINY_OVERRIDES,
        "run.steps": steps,
        "run.checkpoint_every": 2,
        "run.nodes": 2,
        "parallel.timeout_s": 20,  # a lost member fails the others within 20 s
    }
    return stack.post(
        "/api/runs",
        {"experiment": exp["id"], "preset": "moe-grpo", "overrides": overrides,
         "queue": stack.queue},
    )  # fmt: skip


def _steps(stack, run_id: int) -> list[int]:
    body = stack.get(f"/api/runs/{run_id}/metrics?keys=reward/accuracy&max_points=100000")
    return body["steps"]


def _workers_up(stack, n: int) -> bool:
    # 503 until a reconciler is live too; the worker list is there either way
    return len(stack.request("GET", "/api/health")[1]["workers"]) >= n


def test_two_node_run_survives_a_killed_member(redis_stack):
    stack = redis_stack
    for name in ("w1", "w2"):
        stack.start_worker(name)
    stack.start_reconciler()
    stack.wait_for(lambda: _workers_up(stack, 2), 90, "two workers")
    total = 12
    run = _submit_gang(stack, total)
    running = stack.wait_for(
        lambda: (r := stack.run(run["id"]))["current_step"] >= 4 and r, 400, "step 4"
    )
    gang = [m for m in running["gang"] if m["attempt"] == running["attempts"]]
    assert [m["node"] for m in gang] == [0, 1]
    assert {m["worker"] for m in gang} == {"w1@e2e", "w2@e2e"}
    member = next(m["worker"] for m in gang if m["node"] == 1).split("@")[0]

    stack.kill(member)  # SIGKILL: its torchrun and ranks die with it, as with a lost host
    stack.start_worker("w3")
    done = stack.wait_status(run["id"], {"succeeded", "failed", "cancelled"}, timeout=600)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] >= 2  # resumed on a new gang
    assert _steps(stack, run["id"]) == list(range(total))  # every step once
