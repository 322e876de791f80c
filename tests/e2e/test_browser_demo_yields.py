"""The demo yields, in a real browser against a real platform (web server,
Celery worker on the filesystem broker, the real trainer).

`make up`'s own steps queue the demo (lab_up's ``_demo_user`` and
``_queue_study``: 12 runs at the lowest priority) before any worker is up. The
newcomer logs in as the demo user, sees on the Queue page what the demo holds,
queues a run of their own from the run form (default priority), and that run
is first in the queue. Then a worker starts: it trains the newcomer's run
before any of the demo runs queued ahead of it in time. With one click the
Queue page pauses the demo; the newcomer's run still finishes and no demo run
starts.
"""

from __future__ import annotations

import re

import pytest
from browser_harness import ceiling_ms, ceiling_s, log_in_as_the_demo_user, open_form_field
from lab_processes import LabStack
from playwright.sync_api import Page, expect

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(ceiling_s(420))]

# A run the real trainer finishes in seconds.
QUICK = {
    "run.steps": "3",
    "run.threads": "1",
    "rollout.prompts_per_step": "2",
    "rollout.group_size": "4",
    "task.eval_size": "16",
    "warm_start.max_steps": "20",
    "warm_start.eval_every": "10",
    "warm_start.eval_size": "16",
}
# What the first `make up` does before it starts a worker: the demo user, then the demo.
MAKE_UP_FIRST_STEPS = (
    "from pathlib import Path; from django.conf import settings; "
    "from lab.jobs.management.commands.lab_up import Command; "
    "c = Command(); password = c._demo_user(Path(settings.VAR_DIR))[1]; "
    "c._queue_study(steps=3); print(password)"
)


@pytest.fixture
def lab(tmp_path):
    stack = LabStack(tmp_path, "filesystem")
    try:
        stack.env["MOE_LAB_CACHE"] = str(tmp_path / "cache")
        stack.demo_password = stack.manage("shell", "-c", MAKE_UP_FIRST_STEPS).split()[-1]
        stack.url = f"http://127.0.0.1:{stack.port}"
        yield stack
    finally:
        stack.close()


def _queue_my_first_run(page: Page, lab) -> int:
    page.get_by_label("Name").first.fill("my first question")
    page.get_by_role("button", name="Create", exact=True).click()
    page.get_by_role("button", name="New run").click()
    expect(page.get_by_role("heading", name=re.compile("New run in"))).to_be_visible()
    expect(page.locator("#f-priority")).to_have_value("1")  # the default, above the demo's 0
    for path, value in QUICK.items():
        open_form_field(page, path).fill(value)
    page.get_by_role("button", name="Queue run", exact=True).click()
    expect(page.locator(".messages li", has_text=re.compile(r"Run \d+ queued on"))).to_be_visible()
    return int(re.search(r"/runs/(\d+)/", page.url).group(1))


def test_a_users_run_starts_before_the_queued_demo(lab, guard, screenshots):
    demo = lab.get("/api/runs?limit=50")["results"]
    assert len(demo) == 12 and {r["status"] for r in demo} == {"queued"}
    assert {r["priority"] for r in demo} == {0}

    page = guard.new_page()
    log_in_as_the_demo_user(page, lab)
    page.get_by_role("link", name="Queue", exact=True).click()
    box = page.locator("#demo-queue")
    expect(box).to_contain_text("12 unfinished")
    expect(box).to_contain_text("priority 0, the lowest")

    page.get_by_role("link", name="Experiments", exact=True).click()
    mine = _queue_my_first_run(page, lab)
    expect(page.locator('[data-field="placement"]')).to_contain_text(f"position 1 in {lab.queue}")
    assert lab.run(mine)["queue_position"] == 1
    page.get_by_role("link", name="Queue", exact=True).click()
    first_row = page.locator("#queue-bulk table tr").nth(1)
    expect(first_row).to_contain_text(f"#{mine}")
    screenshots.take(page, "queue-demo-yields")

    lab.start_worker("w1")
    started = lab.wait_for(
        lambda: (r := lab.run(mine))["started_at"] and r, ceiling_s(120), "the user's run to start"
    )
    demo_started = [r["id"] for r in lab.get("/api/runs?limit=50")["results"]
                    if r["id"] != mine and r["started_at"]]  # fmt: skip
    assert demo_started == [], f"demo runs {demo_started} started before run {mine}"

    # One click: the demo holds back; the newcomer's run still finishes.
    page.reload()
    page.get_by_role("button", name="Pause the demo").click()
    expect(page.locator(".messages li", has_text="paused 12 runs")).to_be_visible()
    expect(page.locator("#demo-queue")).to_contain_text("12 paused")
    expect(page.get_by_role("button", name="Resume the demo")).to_be_visible()
    lab.wait_status(mine, {"succeeded"}, timeout=ceiling_ms(240) / 1000)
    after = lab.get("/api/runs?limit=50")["results"]
    assert all(r["status"] == "queued" and r["paused"] and not r["started_at"]
               for r in after if r["id"] != mine)  # fmt: skip
    assert started["started_at"] <= lab.run(mine)["finished_at"]
