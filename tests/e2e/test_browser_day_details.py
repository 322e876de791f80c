"""The small things of a researcher's day, in a real browser (no worker needed).

Each test walks one finding that used to surprise: runs waiting on a queue no
worker serves, bulk cancel and cancel-a-sweep, charts that read wrong (repeated
percent ticks, the legend over the title, "μ" next to "x1e-3", "no data yet"
for metrics a run never logs, an empty -1..1 frame before the first step), a
favicon 404 on every page, and API docs that downloaded YAML. The runs are
written through the platform's services as a worker would leave them.
"""

from __future__ import annotations

import re

import pytest
from browser_harness import ceiling_s, wait_all_charts_drawn
from django.contrib.auth import get_user_model
from live_db import update_while_polled
from playwright.sync_api import Page, expect

from lab.experiments.services import create_experiment
from lab.runs import lifecycle, sweeps
from lab.runs.metrics.ingest import ingest_metrics
from lab.runs.models import Run, RunStatus
from trainer import metric_keys as mk

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(ceiling_s(180))]

PASSWORD = "pw-dana"
STEPS = 40


@pytest.fixture
def lab(live_server, transactional_db):
    dana = get_user_model().objects.create_user("dana", password=PASSWORD)
    experiment = create_experiment(owner=dana, name="day details", preset="moe-grpo")
    return {"user": dana, "experiment": experiment, "url": live_server.url}


def _log_in(page: Page, url: str, path: str = "/") -> None:
    page.goto(f"{url}/accounts/login/?next={path}")
    page.get_by_label("Username").fill("dana")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_load_state("networkidle")


def _finished_dense_run(lab) -> Run:
    """A dense run that trained STEPS steps; its clip fraction stays within 0.1-1.2%."""
    run = lifecycle.submit_run(
        owner=lab["user"], experiment=lab["experiment"], preset="dense-grpo",
        overrides={"run.steps": STEPS}, variant="a dense run with a long descriptive name " * 2,
    )  # fmt: skip
    ingest_metrics(
        run.pk,
        [
            {
                "step": s,
                mk.REWARD_ACCURACY: 0.4 + s / 200,
                mk.MISMATCH_KL_K3: 2e-4 + 1e-5 * s,
                mk.POLICY_CLIP_FRAC: 0.001 + 0.011 * s / STEPS,
            }
            for s in range(STEPS)
        ],
    )
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.SUCCEEDED, current_step=STEPS, summary={"steps": STEPS}
    )
    return Run.objects.get(pk=run.pk)


def _chart(page: Page, key: str):
    return page.locator(f'[data-live-chart][data-url*="key={key.replace("/", "%2F")}"]').first


def test_charts_read_right(guard, lab):
    run = _finished_dense_run(lab)
    page = guard.new_page()
    _log_in(page, lab["url"], f"/runs/{run.pk}/")
    wait_all_charts_drawn(page)

    # A share between 0.1% and 1.2%: every percent tick is a different label.
    clip = _chart(page, mk.POLICY_CLIP_FRAC)
    ticks = clip.locator(".ytick text").all_text_contents()
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), ticks
    assert all(t.endswith("%") for t in ticks), ticks

    # The legend sits below the plot, never over the title (dashboard/charts/layout.py:
    # placed in the figure's own coordinates, under the plot area).
    legend_top, plot_bottom = clip.evaluate(
        "el => [el.querySelector('.legend').getBoundingClientRect().top,"
        " el.querySelector('.nsewdrag').getBoundingClientRect().bottom]"
    )
    assert legend_top > plot_bottom

    # KL: one notation, x1e-3 in the axis title, no SI prefix on the ticks.
    kl = _chart(page, mk.MISMATCH_KL_K3)
    title = kl.locator(".g-ytitle").text_content() or ""
    assert "1e-3" in title, title
    assert not any("μ" in t for t in kl.locator(".ytick text").all_text_contents())

    # A finished run that never logged a metric says so instead of "no data yet"
    # (it logged no held-out accuracy); a dense run has no MoE-only chart at all.
    expect(_chart(page, mk.EVAL_ACCURACY)).to_contain_text("not logged by this run")
    assert _chart(page, mk.EXPERTS_MAX_VIOLATION).count() == 0
    guard.assert_clean()


def test_a_queued_run_shows_waiting_cards_not_empty_axes(guard, lab):
    run = lifecycle.submit_run(
        owner=lab["user"], experiment=lab["experiment"], preset="moe-grpo", queue="cpu"
    )
    page = guard.new_page()
    _log_in(page, lab["url"], f"/runs/{run.pk}/")
    wait_all_charts_drawn(page)
    charts = page.locator("[data-live-chart]")
    assert charts.count() > 3
    for i in range(charts.count()):
        chart = charts.nth(i)
        expect(chart).to_have_class(re.compile(r"\bchart-placeholder\b"))
        assert chart.locator(".main-svg").count() == 0
    expect(_chart(page, mk.REWARD_ACCURACY)).to_contain_text("waiting for the first step")
    # The status is shown once.
    assert page.locator('[data-field="status"]').count() == 1
    guard.assert_clean()


def test_a_run_that_fails_on_its_config_offers_clone_and_fix_without_a_reload(guard, lab):
    """The page of a queued run turns to the field errors and "Clone and fix" when
    its worker fails it on its config, as the worker leaves it (status and errors)."""
    run = lifecycle.submit_run(
        owner=lab["user"], experiment=lab["experiment"], preset="moe-grpo", queue="cpu"
    )
    page = guard.new_page()
    _log_in(page, lab["url"], f"/runs/{run.pk}/")
    expect(page.locator('[data-action="clone-and-fix"]')).to_have_count(0)
    update_while_polled(
        run.pk,
        status=RunStatus.FAILED,
        error="the trainer refused its config",
        field_errors={"rollout.max_new_tokens": ["too short for the answer format"]},
    )
    # the status poll (5 s) sees it and the page redraws its actions
    expect(page.locator('[data-action="clone-and-fix"]')).to_be_visible(timeout=20_000)
    expect(page.locator('[data-field="field-errors"]')).to_contain_text("rollout.max_new_tokens")
    assert page.get_by_role("button", name="Requeue (resume from its checkpoint)").count() == 0
    guard.assert_clean()


def test_waiting_on_an_unserved_queue_and_cancelling_in_bulk(guard, lab):
    """Runs queued where no worker listens say so; the runs list cancels the
    ticked runs (after asking), the queue page cancels a whole sweep."""
    user, experiment = lab["user"], lab["experiment"]
    singles = [
        lifecycle.submit_run(owner=user, experiment=experiment, preset="moe-grpo", queue="gpu-a100")
        for _ in range(3)
    ]
    sweep = sweeps.create_sweep(
        owner=user, experiment=experiment, base_config=experiment.base_config,
        grid={"stabilizers.replay.mode": ["none", "r3"]}, seeds=[0], queue="cpu",
    )  # fmt: skip
    page = guard.new_page()
    _log_in(page, lab["url"], "/queue/")
    expect(page.get_by_role("alert").filter(has_text="gpu-a100")).to_contain_text(
        "No live worker serves gpu-a100"
    )

    page.goto(f"{lab['url']}/runs/")
    for run in singles[:2]:
        page.get_by_label(f"select run {run.pk}").check()
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.get_by_role("button", name="Cancel selected").click()
    page.wait_for_load_state("networkidle")
    assert asked and "Cancel the selected runs" in asked[0]
    statuses = dict(Run.objects.values_list("pk", "status"))
    assert [statuses[r.pk] for r in singles] == ["cancelled", "cancelled", "queued"]

    page.goto(f"{lab['url']}/queue/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel sweep").click()
    page.wait_for_load_state("networkidle")
    assert set(sweep.runs.values_list("status", flat=True)) == {"cancelled"}
    guard.assert_clean()


def test_no_missing_favicon_and_api_docs_in_the_browser(guard, lab):
    """No page asks for a file the server lacks (the favicon was a 404 on every
    page), and /api/docs/ is Swagger UI from local static files."""
    page = guard.new_page()
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    _log_in(page, lab["url"], "/runs/")
    for path in ("/", "/experiments/", "/queue/", "/workers/"):
        page.goto(f"{lab['url']}{path}")
        page.wait_for_load_state("networkidle")
    assert page.request.get(f"{lab['url']}/favicon.ico").ok
    icon = page.locator('link[rel="icon"]').get_attribute("href")
    assert icon and page.request.get(f"{lab['url']}{icon}").ok

    page.goto(f"{lab['url']}/api/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("MoE-RL Stability Lab API")
    assert not failed, failed
    guard.assert_clean()  # no CDN: every request stayed on this machine


def test_picking_a_registered_model_fills_the_forms_shape_fields(guard, lab):
    """The form shows the model the run will train: model.source and the
    checkpoint's shape replace the preset's; "none" puts the preset's back."""
    from lab.assets.models import RegisteredModel

    RegisteredModel.objects.create(
        name="tiny-qwen", path="/models/tiny-qwen", family="qwen3",
        model_fields={"d_model": 96, "n_layers": 3, "n_heads": 4},
        total_params=1, active_params=1, vocab_size=100, owner=lab["user"],
    )  # fmt: skip
    page = guard.new_page()
    path = f"/experiments/{lab['experiment'].pk}/runs/new?preset=moe-grpo"
    _log_in(page, lab["url"], path)
    d_model = page.locator('input[name="model.d_model"]')
    preset_width = d_model.input_value()
    assert preset_width != "96"
    page.select_option('select[name="registered_model"]', "tiny-qwen")
    expect(d_model).to_have_value("96")
    expect(page.locator('input[name="model.n_layers"]')).to_have_value("3")
    expect(page.locator('input[name="model.source"]')).to_have_value("/models/tiny-qwen")
    expect(page.locator("[data-change-list]")).to_contain_text("model.d_model")
    page.select_option('select[name="registered_model"]', "")
    expect(d_model).to_have_value(preset_width)
    guard.assert_clean()
