"""The dashboards in a real browser on a stored study (no worker needed).

pytest-django's ``live_server`` serves the app and, because
django.contrib.staticfiles is installed, its static files through the
staticfiles finders: plotly.js comes from dashboard.web.staticfiles.PlotlyJsFinder.
The study is written through the platform's services as a worker would leave
it: two variants x three seeds x 300 steps, the "none" seeds collapsing, one
one-step KL spike. Screenshots of these pages illustrate docs/dashboards.md;
they are synthetic and carry a banner that says so.
"""

from __future__ import annotations

import math
import re
from urllib.parse import parse_qs, urlsplit

import pytest
from browser_harness import TRACE_DRAWN_JS, ceiling_s, chart_points, wait_all_charts_drawn
from django.contrib.auth import get_user_model
from live_db import update_while_polled
from playwright.sync_api import Page, expect

from dashboard.review import services as review
from dashboard.review.models import VerdictLabel
from lab.experiments.services import create_experiment
from lab.runs import lifecycle
from lab.runs.metrics.ingest import ingest_metrics
from lab.runs.models import Run, RunStatus
from trainer import metric_keys as mk

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(ceiling_s(180))]

STEPS = 300
N_EXPERTS = 8
SPIKE_STEP, SPIKE_KL = 123, 0.75
# KL is drawn in the registry's display unit, ×1e-3 (trainer/metric_keys.py).
SPIKE_KL_DRAWN = SPIKE_KL * mk.metric_spec(mk.MISMATCH_KL_K3).scale
PASSWORD = "pw-alice"


def _record(step: int, *, seed: int, collapse_at: int | None, spike: bool) -> dict:
    """One metrics.jsonl line: smooth curves with a per-seed wobble; after a
    collapse the mismatch explodes and accuracy falls."""
    wobble = 0.02 * math.sin(step / 7 + seed)
    broken = collapse_at is not None and step >= collapse_at - 20
    ramp = max(0.0, (step - (collapse_at or STEPS) + 20) / 20) if broken else 0.0
    accuracy = min(0.95, 0.3 + 0.5 * step / STEPS + wobble) * (1 - 0.8 * min(ramp, 1.0))
    kl = 1e-3 * (1 + 0.5 * math.sin(step / 11 + seed)) + 0.02 * ramp
    if spike and step == SPIKE_STEP:
        kl = SPIKE_KL
    rec = {
        "step": step,
        mk.REWARD_MEAN: accuracy + 0.05,
        mk.REWARD_ACCURACY: accuracy,
        mk.MISMATCH_KL_K1: kl * 0.9,
        mk.MISMATCH_KL_K3: kl,
        mk.MISMATCH_EXTREME_TOKEN_FRAC: 0.001 + 0.05 * ramp,
        mk.MISMATCH_ROUTING_INCONSISTENCY: 0.08 + 0.01 * seed + 0.2 * ramp,
        mk.EXPERTS_MAX_VIOLATION: 0.3 + 0.5 * ramp + abs(wobble),
        mk.EXPERTS_ROUTER_ENTROPY: 2.0 - 0.6 * ramp,
        mk.ROUTER_TEMPERATURE: 1.0,
        mk.POLICY_GRAD_NORM: 0.5 + 3 * ramp + abs(wobble) * 5,
        mk.GRADS_COS_POLICY_AUX: wobble,
        mk.GRADS_SURGERY_FRAC: 0.0,
        mk.POLICY_CLIP_FRAC: 0.01 + 0.1 * ramp,
        mk.TIS_CLIP_FRAC: 0.0,
    }
    if step % 10 == 0:
        rec[mk.EVAL_ACCURACY] = accuracy - 0.03
    for layer in range(2):
        raw = [1 + 0.3 * math.sin(step / 30 + e + layer) + (2 * ramp if e == 0 else 0)
               for e in range(N_EXPERTS)]  # fmt: skip
        rec[f"{mk.EXPERTS_LOAD_PREFIX}{layer}"] = [x / sum(raw) for x in raw]
    return rec


@pytest.fixture
def study(live_server, transactional_db):
    """An experiment of two variants x three seeds, stored and finished."""
    alice = get_user_model().objects.create_user("alice", password=PASSWORD)
    experiment = create_experiment(owner=alice, name="R3 vs none", preset="moe-grpo", tags=["r3"])
    runs: dict[str, list[Run]] = {"none": [], "r3": []}
    for variant, preset in (("none", "moe-grpo"), ("r3", "moe-grpo-r3")):
        for seed in range(3):
            collapse_at = 180 + 40 * seed if variant == "none" else None
            run = lifecycle.submit_run(
                owner=alice, experiment=experiment, preset=preset, variant=variant,
                overrides={"run.seed": seed, "run.steps": STEPS},
            )  # fmt: skip
            spike = variant == "r3" and seed == 0
            ingest_metrics(
                run.pk,
                [_record(s, seed=seed, collapse_at=collapse_at, spike=spike) for s in range(STEPS)],
            )
            summary = {"status": "succeeded", "steps": STEPS, "collapsed": collapse_at is not None}
            if collapse_at is not None:
                summary |= {"collapse_step": collapse_at, "collapse_reason": "accuracy fell by 80%"}
            Run.objects.filter(pk=run.pk).update(
                status=RunStatus.SUCCEEDED, summary=summary, current_step=STEPS
            )
            runs[variant].append(Run.objects.get(pk=run.pk))
    review.set_verdict(run=runs["none"][0], author=alice, label=VerdictLabel.COLLAPSED)
    review.set_verdict(run=runs["r3"][0], author=alice, label=VerdictLabel.STABLE)
    return {"experiment": experiment, "runs": runs, "url": live_server.url}


def _log_in(page: Page) -> None:
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()


def test_login_required_then_back_to_the_page(study, guard):
    page = guard.new_page()
    ids = ",".join(str(r.pk) for r in study["runs"]["r3"])
    page.goto(f"{study['url']}/compare/?runs={ids}")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next="))
    _log_in(page)
    expect(page.get_by_role("heading", name="Compare runs")).to_be_visible()
    wait_all_charts_drawn(page)


def test_run_page_keeps_the_spike_zooms_at_full_resolution_and_picks_a_layer(
    study, guard, screenshots
):
    page = guard.new_page()
    spiked = study["runs"]["r3"][0]
    page.goto(f"{study['url']}/runs/{spiked.pk}/")
    _log_in(page)
    wait_all_charts_drawn(page)
    page.locator(".chart-section").first.scroll_into_view_if_needed()
    screenshots.take(page, "run-page", docs=True, synthetic=True)

    # 300 steps drawn from 500-point budgets: everything, the spike included.
    kl = page.locator("[data-live-chart][data-url*='kl_k3']").first
    kl_id = kl.get_attribute("id")
    assert kl.evaluate("el => Math.max(...el._fullData[0].y)") == pytest.approx(SPIKE_KL_DRAWN)
    assert kl.evaluate(TRACE_DRAWN_JS)

    # Downsampled to 40 points the one-step spike must survive (min/max buckets).
    kl.evaluate("el => { el.liveChart.options.maxPoints = 40; return el.liveChart.refresh(); }")
    assert chart_points(page, kl_id) <= 40
    assert kl.evaluate("el => Math.max(...el._fullData[0].y)") == pytest.approx(SPIKE_KL_DRAWN)

    # Zoom: the visible window is fetched again, at full resolution.
    with page.expect_response(lambda r: "start=110" in r.url and "end=140" in r.url) as zoomed:
        kl.evaluate("el => Plotly.relayout(el, {'xaxis.range': [110, 140]})")
    assert zoomed.value.ok
    page.wait_for_function(
        "el => el._fullData[0].x.length > 30 && Math.min(...el._fullData[0].x) <= 110",
        arg=kl.element_handle(),
    )

    # Layer picker: the heatmap and its download links follow the chosen layer.
    with page.expect_response(lambda r: "/heatmap" in r.url and "layer=1" in r.url):
        page.locator("[data-layer-picker]").select_option("1")
    expect(page.locator("#chart-expert-load ~ .chart-downloads a").first).to_have_attribute(
        "href", re.compile(r"layer=1")
    )
    page.locator("#chart-expert-load").scroll_into_view_if_needed()
    screenshots.take(page, "run-page-heatmap", docs=True, synthetic=True)


def test_runs_list_compare_stability_and_experiment_pages(study, guard, screenshots):
    page = guard.new_page()
    page.goto(f"{study['url']}/runs/")
    _log_in(page)
    expect(page.locator("table.runs tbody tr")).to_have_count(6)
    expect(page.locator("table.runs .verdict-collapsed")).to_have_count(1)
    screenshots.take(page, "runs-list", docs=True, synthetic=True)

    page.locator("select[name=status]").select_option("succeeded")
    page.locator("select[name=experiment]").select_option(label="R3 vs none")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"status=succeeded"))
    none0, r30 = study["runs"]["none"][0], study["runs"]["r3"][0]
    for run in (none0, r30):
        page.get_by_label(f"select run {run.pk}", exact=True).check()
    page.get_by_role("button", name="Compare selected").click()
    wait_all_charts_drawn(page)
    expect(page.locator("table.config-diff")).to_contain_text("stabilizers.replay.mode")
    screenshots.take(page, "compare", docs=True, synthetic=True)
    page.locator(".heatmap-row").scroll_into_view_if_needed()
    screenshots.take(page, "compare-heatmaps")

    page.goto(f"{study['url']}/stability/?experiment={study['experiment'].pk}")
    wait_all_charts_drawn(page)
    rows = page.locator("table.stability tbody tr")
    expect(rows).to_have_count(2)
    # "none" collapsed in every seed: a mean; "r3" never did: censored, ">= N".
    expect(rows.filter(has_text=re.compile(r"^\s*none"))).to_contain_text("220")
    expect(rows.filter(has_text=re.compile(r"^\s*r3"))).to_contain_text(">= 300")  # 300 steps run
    screenshots.take(page, "stability", docs=True, synthetic=True)

    # the platform's old experiment address lands on the one experiment page
    experiment_id = study["experiment"].pk
    page.goto(f"{study['url']}/experiments/{experiment_id}/")
    expect(page).to_have_url(re.compile(rf"/experiments/{experiment_id}/$"))
    wait_all_charts_drawn(page)
    expect(page.get_by_role("button", name="New run")).to_be_visible()
    expect(page.get_by_role("button", name="Sweep builder")).to_be_visible()
    expect(page.locator("table.runs tbody tr")).to_have_count(6)
    expect(page.locator("#comments textarea[name=body]")).to_be_visible()
    screenshots.take(page, "experiment-variants", docs=True, synthetic=True)


def test_held_out_accuracy_logged_every_ten_steps_is_drawn(study, guard):
    page = guard.new_page()
    page.goto(f"{study['url']}/runs/{study['runs']['r3'][0].pk}/")
    _log_in(page)
    wait_all_charts_drawn(page)
    held_out = page.locator(
        "[data-live-chart][data-url*='eval_accuracy'], "
        "[data-live-chart][data-url*='eval%2Faccuracy']"
    ).first
    assert held_out.evaluate(TRACE_DRAWN_JS), "the held-out accuracy chart is empty"


def test_run_page_header_follows_the_run_live_and_hides_cancel_when_finished(
    study, guard, monkeypatch
):
    """The header (status badge, step n/N, queue position / worker / attempt, Cancel
    run) follows the same poll as the charts; no reload."""
    monkeypatch.setattr("dashboard.web.views.run_pages.LIVE_INTERVAL_MS", 400)
    alice = get_user_model().objects.get(username="alice")
    run = lifecycle.submit_run(
        owner=alice, experiment=study["experiment"], preset="moe-grpo", variant="live",
        overrides={"run.steps": STEPS},
    )  # fmt: skip
    ingest_metrics(run.pk, [_record(s, seed=0, collapse_at=None, spike=False)
                                         for s in range(20)])  # fmt: skip
    page = guard.new_page()
    page.goto(f"{study['url']}/runs/{run.pk}/")
    _log_in(page)
    placement = page.locator(".card [data-field=placement]")
    expect(placement).to_contain_text(f"position 1 in {run.queue}")
    update_while_polled(
        run.pk, status=RunStatus.RUNNING, current_step=20, worker_host="w1", attempts=1
    )
    header = page.locator("h1 [data-field=status]")
    expect(header).to_have_text("running")
    expect(placement).to_contain_text("worker w1 · attempt 1/3")
    cancel = page.get_by_role("button", name="Cancel run")
    expect(cancel).to_be_visible()
    expect(page.get_by_role("button", name="Delete run")).to_be_hidden()
    page.evaluate("window.__sameDocument = true")

    update_while_polled(run.pk, current_step=150)
    expect(page.locator(".card [data-field=steps]")).to_have_text(f"150/{STEPS}")
    expect(page.locator(".card [data-field=progress]")).to_have_attribute("value", "150")

    update_while_polled(run.pk, status=RunStatus.SUCCEEDED, current_step=STEPS)
    expect(header).to_have_text("succeeded")
    expect(header).to_have_class(re.compile(r"\bsucceeded\b"))
    expect(page.locator(".card [data-field=steps]")).to_have_text(f"{STEPS}/{STEPS}")
    expect(placement).not_to_contain_text("position")
    expect(cancel).to_be_hidden()
    expect(page.get_by_role("button", name="Delete run")).to_be_visible()
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    guard.assert_clean()


def test_compare_page_fetches_its_metric_charts_as_one_group(study, guard):
    """The first chart alone, the rest in one request; a zoomed chart then fetches
    its own window."""
    page = guard.new_page()
    chart_requests: list[str] = []
    page.on(
        "request",
        lambda r: chart_requests.append(r.url) if "/compare/chart" in r.url else None,
    )
    ids = ",".join(str(r.pk) for r in study["runs"]["none"] + study["runs"]["r3"])
    page.goto(f"{study['url']}/compare/?runs={ids}")
    _log_in(page)
    wait_all_charts_drawn(page)
    grouped = page.locator("[data-live-group] [data-live-chart]")
    n_charts = grouped.count()
    assert n_charts > 5
    assert [u for u in chart_requests if "/compare/chart?" in u] == []
    group_requests = [u for u in chart_requests if "/compare/charts?" in u]
    assert len(group_requests) == 2, group_requests
    key_counts = sorted(
        len(parse_qs(urlsplit(u).query)["keys"][0].split(",")) for u in group_requests
    )
    assert key_counts == [1, n_charts - 1]

    kl = page.locator("[data-live-chart][data-url*='kl_k3']").first
    assert kl.evaluate(TRACE_DRAWN_JS)
    with page.expect_response(lambda r: "/compare/chart?" in r.url and "start=110" in r.url):
        kl.evaluate("el => Plotly.relayout(el, {'xaxis.range': [110, 140]})")
    guard.assert_clean()
