"""The tracking hub's pages in a real browser: an experiment's runs table (columns,
sorting by a click on a column's title, MLflow's filter grammar, CSV) and its
parallel coordinates; a run's and the compare page's charts on the step, wall-clock
and relative-time axes; the run links MLflow clients print; an external run's
artifacts and checkpoint on its page. Runs are logged through the MLflow API and
the platform's services, as clients and workers leave them."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_harness import ceiling_s, wait_all_charts_drawn
from django.contrib.auth import get_user_model
from mlflow_rest import Mlflow
from playwright.sync_api import Page, expect

from lab.experiments.services import create_experiment
from lab.runs import lifecycle
from lab.runs.metrics.ingest import ingest_metrics
from lab.runs.models import Run, RunStatus
from trainer import metric_keys as mk

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(ceiling_s(240))]

PASSWORD = "pw-hub"
T0 = 1_700_000_000_000


@pytest.fixture
def lab(live_server, transactional_db, settings, tmp_path):
    settings.LAB_ARTIFACT_STORE = f"file://{tmp_path}/artifacts"
    user = get_user_model().objects.create_user("erin", password=PASSWORD)
    experiment = create_experiment(owner=user, name="hub", preset="moe-grpo")
    return {"user": user, "experiment": experiment, "url": live_server.url}


def _log_in(page: Page, url: str, path: str = "/") -> None:
    page.goto(f"{url}/accounts/login/?next={path}")
    page.get_by_label("Username").fill("erin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_load_state("networkidle")


def _lab_run(lab, variant: str, lr: float, accuracy: float) -> Run:
    run = lifecycle.submit_run(
        owner=lab["user"], experiment=lab["experiment"], preset="moe-grpo",
        overrides={"run.steps": 10, "optim.lr": lr}, variant=variant,
    )  # fmt: skip
    ingest_metrics(run.pk, [
        {"step": s, mk.REWARD_ACCURACY: accuracy, mk.TIME_WALL: T0 / 1000 + 20 * s}
        for s in range(10)])  # fmt: skip
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=10)
    return run


def _external_run(lab) -> int:
    ml = Mlflow(lab["user"])
    run_id = ml.ok("POST", "runs/create", {
        "experiment_id": str(lab["experiment"].pk), "run_name": "trl", "start_time": T0,
    })["run"]["info"]["run_id"]  # fmt: skip
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "params": [
        {"key": "learning_rate", "value": "1e-6"}], "metrics": [
        {"key": "reward/accuracy", "value": 0.2 + 0.01 * s, "timestamp": T0 + 90_000 * s, "step": s}
        for s in range(1, 8)]})  # fmt: skip
    root = f"{lab['experiment'].pk}/{run_id}/artifacts"
    ml.artifact("PUT", f"{root}/notes.txt", b"hello from the trainer")
    model = ml.ok("POST", "logged-models", {"experiment_id": str(lab["experiment"].pk),
                  "name": "checkpoint-7", "source_run_id": run_id})["model"]["info"]  # fmt: skip
    mroot = f"{lab['experiment'].pk}/models/{model['model_id']}/artifacts"
    ml.artifact("PUT", f"{mroot}/model.safetensors", b"\0" * 256)
    ml.ok("PATCH", f"logged-models/{model['model_id']}", {"status": "LOGGED_MODEL_READY"})
    ml.ok("POST", "runs/update", {"run_id": run_id, "status": "FINISHED"})
    return int(run_id)


def _row_ids(page: Page) -> list[int]:
    return [int(x) for x in page.locator("[data-runs-table] tbody tr[data-run]").evaluate_all(
        "rows => rows.map(r => r.dataset.run)")]  # fmt: skip


def test_runs_table_and_parallel_coordinates(guard, lab, screenshots):
    hi = _lab_run(lab, "lr-hi", 1e-3, 0.6)
    lo = _lab_run(lab, "lr-lo", 2e-4, 0.8)
    mid = _lab_run(lab, "lr-mid", 5e-4, 0.7)
    external = _external_run(lab)
    page = guard.new_page()
    _log_in(page, lab["url"], f"/experiments/{lab['experiment'].pk}/")
    page.get_by_role("link", name="Runs table and parallel coordinates").click()
    expect(page.locator("[data-runs-table] tbody tr[data-run]")).to_have_count(4)
    header = page.locator("[data-runs-table] thead")
    expect(header).to_contain_text("optim.lr")
    expect(header).to_contain_text("reward/accuracy")
    # sort by a click on the column's title, then the other way
    page.locator('th[data-column="metric:reward/accuracy"] a').click()
    expect(page.locator('th[data-column="metric:reward/accuracy"]')).to_have_attribute(
        "aria-sort", "ascending"
    )
    assert _row_ids(page) == [external, hi.pk, mid.pk, lo.pk]
    page.locator('th[data-column="metric:reward/accuracy"] a').click()
    expect(page.locator('th[data-column="metric:reward/accuracy"]')).to_have_attribute(
        "aria-sort", "descending"
    )
    assert _row_ids(page) == [lo.pk, mid.pk, hi.pk, external]
    # MLflow's filter grammar; a refused filter is named on the page
    page.locator('[data-field="filter"]').fill("metrics.`reward/accuracy` >= 0.7")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("[data-runs-table] tbody tr[data-run]")).to_have_count(2)
    assert sorted(_row_ids(page)) == sorted([lo.pk, mid.pk])
    page.locator('[data-field="filter"]').fill("metrics.x LIKE 'y'")
    page.get_by_role("button", name="Show").click()
    expect(page.locator('[data-field="filter-error"]')).to_be_visible()
    # columns chosen in the pickers; the parallel coordinates draw one axis per column
    page.locator('[data-field="filter"]').fill("")
    page.locator('[data-field="params"]').select_option(["optim.lr", "learning_rate"])
    page.locator('[data-field="metrics"]').select_option(["reward/accuracy"])
    page.get_by_role("button", name="Show").click()
    expect(page.locator("[data-runs-table] thead")).to_contain_text("learning_rate")
    chart = page.locator("#runs-parallel")
    expect(chart.locator(".parcoords .axis-title")).to_have_count(3)
    titles = chart.locator(".parcoords .axis-title").evaluate_all(
        "els => els.map(e => e.textContent)"
    )
    assert titles == ["learning_rate", "optim.lr", "reward/accuracy"]  # the pickers' order
    lines = chart.evaluate("el => el._fullData[0].dimensions[0].values.length")
    assert lines == 4
    csv = page.request.get(lab["url"] + page.locator('[data-download="csv"]').get_attribute("href"))
    assert csv.ok and csv.text().splitlines()[0].endswith("learning_rate,optim.lr,reward/accuracy")
    screenshots.take(page, "runs-table", synthetic=True)


def test_time_axes_on_the_run_and_compare_pages(guard, lab):
    lab_run = _lab_run(lab, "lr-hi", 1e-3, 0.6)
    external = _external_run(lab)
    page = guard.new_page()
    _log_in(page, lab["url"], f"/runs/{external}/")
    wait_all_charts_drawn(page)
    reward = f'[data-live-chart][data-url*="key={mk.REWARD_ACCURACY.replace("/", "%2F")}"]'
    assert page.locator(reward).first.evaluate("el => el._fullLayout.xaxis.type") == "linear"
    page.locator('[data-x-axis] a[data-x-mode="wall"]').click()
    wait_all_charts_drawn(page)
    chart = page.locator(reward).first
    assert chart.evaluate("el => el._fullLayout.xaxis.type") == "date"
    first_x = chart.evaluate("el => el._fullData[0].x[0]")
    assert first_x == T0 + 90_000  # ms on a date axis: the time it was logged
    page.locator('[data-x-axis] a[data-x-mode="relative"]').click()
    wait_all_charts_drawn(page)
    chart = page.locator(reward).first
    assert "time since the run started" in chart.evaluate("el => el._fullLayout.xaxis.title.text")
    assert chart.evaluate("el => el._fullData[0].x[0]") == pytest.approx(1.5)  # min after start
    # the compare page: both runs, each on its own clock
    page.goto(f"{lab['url']}/compare/?runs={lab_run.pk},{external}&x=wall")
    wait_all_charts_drawn(page)
    chart = page.locator(reward).first
    assert chart.evaluate("el => el._fullLayout.xaxis.type") == "date"
    assert (
        chart.evaluate("el => el._fullData.filter(t => t.meta && t.meta.role === 'run').length")
        == 2
    )
    expect(page.locator('[data-x-axis] [aria-current="true"]')).to_have_text("wall clock")


def test_client_run_links_and_the_run_pages_files(guard, lab):
    external = _external_run(lab)
    page = guard.new_page()
    # the link the MLflow client prints, before logging in: the run page after the login
    page.goto(f"{lab['url']}/#/experiments/{lab['experiment'].pk}/runs/{external}")
    page.wait_for_url(f"**/accounts/login/?next=/runs/{external}/")
    page.get_by_label("Username").fill("erin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"**/runs/{external}/")
    page.goto(f"{lab['url']}/#/experiments/{lab['experiment'].pk}")
    page.wait_for_url(f"**/experiments/{lab['experiment'].pk}/")
    page.goto(f"{lab['url']}/runs/{external}/")
    files = page.locator('[data-field="artifacts"]')
    expect(files.locator('[data-artifact="notes.txt"]')).to_be_visible()
    with page.expect_download() as download:
        files.locator('[data-artifact="notes.txt"]').click()
    assert Path(download.value.path()).read_bytes() == b"hello from the trainer"
    with page.expect_download() as checkpoint:
        files.locator('[data-download="model"]').click()
    assert checkpoint.value.suggested_filename == "checkpoint-7.zip"
