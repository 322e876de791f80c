"""A newcomer's day in a real browser against a real platform, without surprises.

The platform runs as separate processes (tests/lab_processes.py ``LabStack``:
the web server, one Celery worker on the filesystem broker spawning the real
trainer CLI, one SQLite file). The journey, each step a finding that used to
surprise and now does not:

* log in as the demo user ``make up`` creates (lab_up's ``_demo_user``);
* "New run" on the runs list; the form opens with the preset's key fields and
  every other section folded; a bad value below the fold comes back with a
  summary at the top linking to it, the page opened at that field, the
  priority and every other value kept; the changes from the preset are listed;
* the run page shows the warm start as its own phase, live, then trains;
* a second run of the same base says "using cached base policy";
* a long run is cancelled from the runs list (the page asks first);
* compare, then the stability review of the selected runs: the cancelled run
  is not a seed until the page's switch includes it, and the table, both
  charts and the CSV/JSON downloads (through the page's own links) hold
  exactly the selected runs;
* the web process restarts, and ``make up``'s demo-user step runs again: the
  browser stays logged in.
"""

from __future__ import annotations

import csv
import io
import re

import pytest
from browser_harness import (
    ceiling_ms,
    ceiling_s,
    log_in_as_the_demo_user,
    open_form_field,
    wait_all_charts_drawn,
)
from lab_processes import LabStack
from playwright.sync_api import Page, expect

from lab.jobs import launch

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(ceiling_s(420))]

# A run the real trainer finishes in seconds, with a warm start long enough
# (a few hundred SFT steps, ~10-20 s here) to be seen on the run page.
QUICK = {
    "run.steps": "4",
    "run.threads": "1",
    "rollout.prompts_per_step": "2",
    "rollout.group_size": "4",
    "task.eval_size": "16",
    "warm_start.max_steps": "300",
    "warm_start.eval_every": "25",
    "warm_start.eval_size": "16",
}
TIMEOUT_MS = ceiling_ms(180)
DEMO_USER = (
    "from pathlib import Path; from django.conf import settings; "
    "from lab.jobs.management.commands.lab_up import Command; "
    "print(Command()._demo_user(Path(settings.VAR_DIR))[1])"
)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("newcomer")
    stack = LabStack(root, "filesystem")
    try:
        stack.env["MOE_LAB_CACHE"] = str(root / "cache")
        stack.start_worker("w1")
        stack.experiment = stack.post(
            "/api/experiments", {"name": "first day", "preset": "moe-grpo"}
        )
        stack.url = f"http://127.0.0.1:{stack.port}"
        stack.demo_password = stack.manage("shell", "-c", DEMO_USER).strip().splitlines()[-1]
        yield stack
    finally:
        stack.close()


def _configure_with_a_mistake_then_queue(page: Page, lab) -> int:
    page.get_by_role("link", name="Runs", exact=True).click()
    page.get_by_role("button", name="New run").click()
    expect(page.get_by_role("heading", name=re.compile("New run in"))).to_be_visible()
    # Key fields first and open; the other sections folded.
    expect(page.locator('[id="f-algorithm.name"]')).to_be_visible()
    expect(page.locator('[id="f-warm_start.max_steps"]')).to_be_hidden()
    page.locator('#run-form input[name="variant"]').fill("none")
    page.locator("#f-priority").fill("5")
    for path, value in QUICK.items():
        open_form_field(page, path).fill(value)
    # The changes from the preset are listed before submitting.
    changes = page.locator("#changes")
    expect(changes).to_contain_text("run.steps")
    expect(changes).to_contain_text("warm_start.max_steps")
    expect(page.locator('[data-changed-count="warm_start"]')).to_have_text("3 changed")

    # A mistake below the fold: collapse window -1.
    open_form_field(page, "run.collapse.window").fill("-1")
    page.locator("details#section-run > summary").click()  # fold it again
    page.get_by_role("button", name="Queue run", exact=True).click()
    summary = page.locator("#form-errors")
    expect(summary).to_be_visible()
    link = summary.get_by_role("link", name=re.compile(r"^run\.collapse\.window: "))
    expect(link).to_be_visible()
    # The page opened at the first error: its field has the focus and is on screen.
    bad = page.locator('[id="f-run.collapse.window"]')
    expect(bad).to_be_focused()
    expect(bad).to_be_in_viewport()
    # Everything typed is kept, priority included.
    expect(page.locator("#f-priority")).to_have_value("5")
    expect(page.locator('[id="f-warm_start.max_steps"]')).to_have_value("300")

    link.click()
    bad.fill("")
    bad.fill("8")
    page.get_by_role("button", name="Queue run", exact=True).click()
    expect(page.locator(".messages li", has_text=re.compile(r"Run \d+ queued on"))).to_be_visible()
    run_id = int(re.search(r"/runs/(\d+)/", page.url).group(1))
    assert lab.run(run_id)["priority"] == 5
    return run_id


def _watch_warm_start_then_training(page: Page, lab, run_id: int) -> None:
    phase = page.locator('[data-field="phase"]')
    expect(phase).to_contain_text("warm start (supervised base policy", timeout=TIMEOUT_MS)
    expect(phase).to_contain_text(re.compile(r"SFT step \d+/300 .* ETA"))
    expect(page.locator('[data-field="status"]')).to_have_text("succeeded", timeout=TIMEOUT_MS)
    expect(phase).to_contain_text("base policy warm-started in")
    wait_all_charts_drawn(page)


def _cache_hit_run(lab) -> int:
    overrides = {k: int(v) for k, v in QUICK.items()}
    run = lab.post(
        "/api/runs",
        {"experiment": lab.experiment["id"], "preset": "moe-grpo-r3", "overrides": overrides,
         "queue": lab.queue, "variant": "r3"},
    )  # fmt: skip
    lab.wait_status(run["id"], {"succeeded"}, timeout=TIMEOUT_MS / 1000)
    return run["id"]


def _cancel_a_long_run_from_the_list(page: Page, lab) -> int:
    overrides = {**{k: int(v) for k, v in QUICK.items()}, "run.steps": 5000}
    run = lab.post(
        "/api/runs",
        {"experiment": lab.experiment["id"], "preset": "moe-grpo", "queue": lab.queue,
         "overrides": overrides, "variant": "none"},
    )  # fmt: skip
    lab.wait_for(lambda: lab.run(run["id"])["current_step"] >= 2, TIMEOUT_MS / 1000, "steps")
    page.get_by_role("link", name="Runs", exact=True).click()
    page.get_by_label(f"select run {run['id']}", exact=True).check()
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.get_by_role("button", name="Cancel selected").click()
    expect(page.locator(".messages li", has_text="Cancelled 1 run")).to_be_visible()
    assert asked and "Cancel the selected runs?" in asked[0]
    lab.wait_status(run["id"], {"cancelled"}, timeout=ceiling_s(60))
    return run["id"]


def _review_exactly_the_selected_runs(page: Page, lab, ids: list[int], cancelled: int) -> None:
    page.get_by_role("link", name="Runs", exact=True).click()
    for rid in ids:
        page.get_by_label(f"select run {rid}", exact=True).check()
    page.get_by_role("button", name="Compare selected").click()
    expect(page.get_by_role("heading", name="Compare runs")).to_be_visible()
    wait_all_charts_drawn(page)

    page.get_by_role("link", name="Runs", exact=True).click()
    for rid in ids:
        page.get_by_label(f"select run {rid}", exact=True).check()
    page.get_by_role("button", name="Stability review of selected").click()
    expect(page.get_by_role("heading", name="Stability review")).to_be_visible()
    assert sorted(map(int, re.findall(r"runs=(\d+)", page.url))) == sorted(ids)
    expect(page.locator(".seed-rule")).to_contain_text("not seeds of their variant")
    expect(page.get_by_text(f"#{cancelled} (cancelled)")).to_be_visible()
    rows = page.locator("table.stability tbody tr")
    expect(rows).to_have_count(2)  # variants none and r3, one seed each
    expect(rows.filter(has_text="none").locator("td").nth(1)).to_have_text("1")
    wait_all_charts_drawn(page)
    _downloads_hold_exactly(page, ids, seeds={"none": 1, "r3": 1})

    page.get_by_role("switch", name="Include cancelled and failed runs").click()
    expect(page.locator(".seed-rule")).to_contain_text("included as seeds")
    expect(rows.filter(has_text="none").locator("td").nth(1)).to_have_text("2")
    wait_all_charts_drawn(page)
    _downloads_hold_exactly(page, ids, seeds={"none": 2, "r3": 1})


def _downloads_hold_exactly(page: Page, ids: list[int], seeds: dict[str, int]) -> None:
    """The page's own CSV/JSON links and chart URLs carry every selected run."""
    origin = re.match(r"https?://[^/]+", page.url).group(0)
    links = {
        name: page.locator(".chart-downloads a", has_text=name).first.get_attribute("href")
        for name in ("CSV", "JSON")
    }
    for href in links.values():
        assert sorted(map(int, re.search(r"runs=([\d%C,]+)", href).group(1)
                          .replace("%2C", ",").split(","))) == sorted(ids)  # fmt: skip
    table = page.request.get(origin + links["CSV"]).text()
    assert {r["variant"]: int(r["runs"]) for r in csv.DictReader(io.StringIO(table))} == seeds
    data = page.request.get(origin + links["JSON"]).json()["rows"]
    assert {r["variant"]: r["runs"] for r in data} == seeds
    for chart in page.locator("[data-live-chart]").all():
        payload = page.request.get(origin + chart.get_attribute("data-url")).json()
        names = " ".join(t.get("name") or "" for t in payload["figure"]["data"])
        assert all(v in names for v in seeds), names


def _restart_web_and_stay_logged_in(page: Page, lab) -> None:
    lab.kill("web", 15)
    # What the next `make up` does before starting the web server again.
    assert lab.manage("shell", "-c", DEMO_USER).strip().splitlines()[-1] == lab.demo_password
    lab.start("web", launch.web_command("127.0.0.1", lab.port))
    lab.wait_for(lambda: lab._up(), ceiling_s(60), "web server")
    page.reload()
    expect(page.get_by_role("heading", name="Stability review")).to_be_visible()
    expect(page).not_to_have_url(re.compile(r"/accounts/login/"))


def test_a_newcomers_day(lab, guard, screenshots):
    page = guard.new_page()
    log_in_as_the_demo_user(page, lab)
    first = _configure_with_a_mistake_then_queue(page, lab)
    screenshots.take(page, "warm-start")
    _watch_warm_start_then_training(page, lab, first)
    screenshots.take(page, "first-run-done")

    cached = _cache_hit_run(lab)
    page.goto(f"{lab.url}/runs/{cached}/")
    expect(page.locator('[data-field="phase"]')).to_contain_text("using cached base policy")

    cancelled = _cancel_a_long_run_from_the_list(page, lab)
    _review_exactly_the_selected_runs(page, lab, [first, cached, cancelled], cancelled)
    screenshots.take(page, "stability-selected")
    _restart_web_and_stay_logged_in(page, lab)
