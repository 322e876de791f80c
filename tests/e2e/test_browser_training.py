"""A team member's day in a real browser against a real platform.

The platform runs as separate processes, exactly as ``make up`` starts it:
the web server (runserver; DEBUG serves static files, plotly.js included,
through whitenoise), a Celery worker on the embedded filesystem broker that
spawns the real trainer CLI, and a migrated SQLite file both share (or a
fresh PostgreSQL database when the suite runs with DATABASE_URL=postgres://).
These are the ``LabStack`` processes of tests/lab_processes.py.

Scenario: log in; configure a run in the schema-generated form, submit a bad
value and see the field error, fix it and queue the run; watch the run page
update live (charts gain points and the status turns to succeeded without a
reload); compare it with a second run, open the stability review, save the
comparison; leave comments (escaped) and a verdict. A screenshot of each page
is kept under test-artifacts/e2e/.
"""

from __future__ import annotations

import re

import pytest
from browser_harness import (
    RECORD_UPDATES_JS,
    ceiling_ms,
    ceiling_s,
    chart_points,
    open_form_field,
    wait_all_charts_drawn,
)
from lab_processes import LabStack
from playwright.sync_api import Page, expect

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(ceiling_s(300))]


# A run the real trainer finishes in seconds on a CPU (a few SFT steps of warm start).
TINY_FORM_VALUES = {
    "run.steps": "4",
    "run.threads": "1",
    "warm_start.max_steps": "20",
    "rollout.prompts_per_step": "2",
    "rollout.group_size": "4",
    "task.eval_size": "16",
}
LIVE_TIMEOUT_MS = ceiling_ms(180)
ESCAPE_PROBE = "<b>x</b> reads literally"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Web server + one worker on the filesystem broker, an experiment, and a
    second run (R3) queued through the API so there is something to compare."""
    root = tmp_path_factory.mktemp("lab")
    stack = LabStack(root, "filesystem")
    try:
        # Warm-start policies are cached by config hash: keep them in this test's folder.
        stack.env["MOE_LAB_CACHE"] = str(root / "cache")
        stack.start_worker("w1")
        experiment = stack.post(
            "/api/experiments", {"name": "R3 vs none (browser)", "preset": "moe-grpo"}
        )
        overrides = {k: int(v) for k, v in TINY_FORM_VALUES.items()}
        stack.r3_run = stack.post(
            "/api/runs",
            {"experiment": experiment["id"], "preset": "moe-grpo-r3", "overrides": overrides,
             "queue": stack.queue, "variant": "r3"},
        )  # fmt: skip
        stack.experiment = experiment
        stack.url = f"http://127.0.0.1:{stack.port}"
        yield stack
    finally:
        stack.close()


def _log_in(page: Page, lab) -> None:
    page.goto(f"{lab.url}/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))
    page.get_by_label("Username").fill("e2e")
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Experiments")).to_be_visible()


def _field(page: Page, path: str):
    return open_form_field(page, path)


def _queue_run_through_the_form(page: Page, lab, shots) -> int:
    page.get_by_role("link", name=lab.experiment["name"]).click()
    # the one experiment page (the dashboard's) carries the platform's actions
    expect(page).to_have_url(re.compile(rf"/experiments/{lab.experiment['id']}/$"))
    page.get_by_role("button", name="New run").click()
    expect(page.get_by_role("heading", name=re.compile("New run in"))).to_be_visible()
    page.locator('#run-form input[name="variant"]').fill("none")
    for path, value in TINY_FORM_VALUES.items():
        _field(page, path).fill(value)

    # A wrong type: the form comes back with the error beside the field, values kept.
    _field(page, "run.steps").fill("four")
    page.get_by_role("button", name="Queue run", exact=True).click()
    error = page.locator(".field.has-error .error")
    expect(error).to_have_count(1)
    expect(error).to_contain_text("run.steps")
    expect(_field(page, "rollout.group_size")).to_have_value("4")
    _field(page, "run.steps").scroll_into_view_if_needed()
    shots.take(page, "run-form-error", docs=True)

    _field(page, "run.steps").fill(TINY_FORM_VALUES["run.steps"])
    page.get_by_role("button", name="Queue run", exact=True).click()
    queued = page.locator(".messages li", has_text=re.compile(r"Run \d+ queued on"))
    expect(queued).to_be_visible()
    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))  # the one run page
    return int(re.search(r"/runs/(\d+)/", page.url).group(1))


def _watch_live_until_done(page: Page, lab, run_id: int, shots) -> None:
    page.get_by_role("link", name="Runs", exact=True).click()
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    shots.take(page, "runs-list-live")
    page.get_by_role("link", name=f"#{run_id}", exact=True).click()
    expect(page).to_have_url(re.compile(rf"/runs/{run_id}/$"))
    page.evaluate("window.__samePage = true")  # gone if the page reloads

    status = page.locator('[data-field="status"]')
    assert status.inner_text() in {"queued", "running"}, "the run finished before the page opened"
    chart = page.locator("[data-live-chart]").first
    chart_id = chart.get_attribute("id")
    page.wait_for_function(  # the first live update drew the (still empty) chart
        "id => (window.__chartUpdates[id] || []).length > 0", arg=chart_id, timeout=ceiling_ms(60)
    )
    first_points = page.evaluate("id => window.__chartUpdates[id][0]", chart_id)

    page.wait_for_function(
        "id => (window.__chartUpdates[id] || []).some(n => n > 0)",
        arg=chart_id, timeout=LIVE_TIMEOUT_MS,
    )  # fmt: skip
    shots.take(page, "run-live")
    expect(status).to_have_text("succeeded", timeout=LIVE_TIMEOUT_MS)
    steps = int(TINY_FORM_VALUES["run.steps"])
    page.wait_for_function(
        "([id, n]) => (window.__chartUpdates[id] || []).includes(n)",
        arg=[chart_id, steps], timeout=LIVE_TIMEOUT_MS,
    )  # fmt: skip

    updates = page.evaluate("id => window.__chartUpdates[id]", chart_id)
    assert first_points < steps, updates
    assert updates[-1] == steps == chart_points(page, chart_id), updates
    assert page.evaluate("window.__samePage === true"), "the page reloaded"
    expect(page.locator('#run-status [data-field="steps"]')).to_have_text(f"{steps}/{steps}")
    expect(page.locator('[data-field="log"]')).not_to_have_text("No log yet.")
    shots.take(page, "run-finished")
    wait_all_charts_drawn(page)
    page.locator(".chart-section").first.scroll_into_view_if_needed()
    shots.take(page, "run-page-charts")


def _comment_is_escaped(page: Page) -> None:
    page.locator("form:has(textarea[name=body]) textarea").fill(ESCAPE_PROBE)
    page.get_by_role("button", name="Comment", exact=True).click()
    expect(page.get_by_text(ESCAPE_PROBE, exact=False)).to_be_visible()
    assert page.locator("b", has_text=re.compile(r"^x$")).count() == 0, (
        "the comment was not escaped"
    )


def _give_verdict(page: Page, shots) -> None:
    review = page.locator("#review")
    review.get_by_label("Verdict").select_option("stable")
    review.get_by_label("Note").fill("no collapse in 4 steps")
    review.get_by_role("button", name="Record verdict").click()
    expect(page.locator("#review .verdict-stable").first).to_have_text("stable")
    shots.take(page, "run-verdict")


def _compare_review_and_save(page: Page, lab, run_id: int, shots) -> None:
    lab.wait_status(lab.r3_run["id"], {"succeeded"}, timeout=LIVE_TIMEOUT_MS / 1000)
    page.get_by_role("link", name="Runs", exact=True).click()
    for rid in (run_id, lab.r3_run["id"]):
        page.get_by_label(f"select run {rid}", exact=True).check()
    page.get_by_role("button", name="Compare selected").click()
    expect(page.get_by_role("heading", name="Compare runs")).to_be_visible()
    wait_all_charts_drawn(page)
    diff = page.locator("table.config-diff")
    expect(diff).to_contain_text("stabilizers.replay.mode")
    shots.take(page, "compare")

    page.get_by_role("link", name="Stability review of these runs").click()
    expect(page.get_by_role("heading", name="Stability review")).to_be_visible()
    expect(page.locator("table.stability tbody tr")).to_have_count(2)
    wait_all_charts_drawn(page)
    shots.take(page, "stability")

    page.go_back()
    wait_all_charts_drawn(page)
    page.get_by_label("Name").fill("R3 vs none, tiny")
    page.get_by_role("button", name="Save comparison").click()
    expect(page.get_by_role("heading", name="Comparison: R3 vs none, tiny")).to_be_visible()
    wait_all_charts_drawn(page)
    _comment_is_escaped(page)
    wait_all_charts_drawn(page)
    shots.take(page, "saved-comparison-comments", docs=True)


def test_configure_queue_watch_compare_and_review(lab, guard, screenshots):
    guard.context.add_init_script(RECORD_UPDATES_JS)
    page = guard.new_page()
    _log_in(page, lab)
    screenshots.take(page, "experiments")
    run_id = _queue_run_through_the_form(page, lab, screenshots)
    _watch_live_until_done(page, lab, run_id, screenshots)
    _give_verdict(page, screenshots)
    _comment_is_escaped(page)
    screenshots.take(page, "run-comment")
    assert lab.run(run_id)["status"] == "succeeded"
    _compare_review_and_save(page, lab, run_id, screenshots)
