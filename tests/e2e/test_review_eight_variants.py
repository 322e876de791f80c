"""The stability review, the experiment page and the run page at eight variants, in
a real browser: every chart follows the layout rule (dashboard/charts/layout.py):
nothing overlaps, no axis runs past its data's or its quantity's bounds. The study
is synthetic (bench/review_study.py); its screenshots in docs/screenshots/ say so
on their face."""

from __future__ import annotations

import pytest
from browser_harness import ceiling_s, layout_problems, wait_all_charts_drawn
from django.contrib.auth import get_user_model

from bench.review_study import VARIANTS, make_study
from dashboard.charts.layout import LEGEND_ROW_PX, MAX_LEGEND_ROWS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(ceiling_s(300))]
PASSWORD = "pw-alice"
# The legend's bound, with room for its padding.
MAX_LEGEND_PX = MAX_LEGEND_ROWS * LEGEND_ROW_PX + 24


@pytest.fixture
def eight(live_server, transactional_db):
    alice = get_user_model().objects.create_user("alice", password=PASSWORD)
    return make_study(alice) | {"url": live_server.url}


def _open(page, url: str) -> None:
    page.goto(url)
    if "/accounts/login" in page.url:
        page.get_by_label("Username").fill("alice")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(url)
    wait_all_charts_drawn(page)


@pytest.mark.parametrize("which", ["review", "experiment", "run"])
def test_every_chart_keeps_the_layout_rule_at_eight_variants(eight, guard, screenshots, which):
    assert len(VARIANTS) == 8
    experiment = eight["experiment"].pk
    run = eight["runs"][VARIANTS[4][0]][0]  # a collapsed seed of the largest dose
    url = {
        "review": f"{eight['url']}/stability/?experiment={experiment}",
        "experiment": f"{eight['url']}/experiments/{experiment}/",
        "run": f"{eight['url']}/runs/{run.pk}/",
    }[which]
    page = guard.context.new_page()
    _open(page, url)
    screenshots.take(page, f"eight-variants-{which}", docs=True, synthetic=True, full_page=True)
    assert layout_problems(page, MAX_LEGEND_PX) == ""
