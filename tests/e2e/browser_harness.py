"""Headless Debian chromium for the browser tests and the browser benchmark.

Playwright cannot download its own browsers here, so this launches the system
chromium with the flags that keep it quiet and local: no GPU, no sandbox (it
runs as root in containers), no background, component-update, sync or QUIC
traffic. ``launch()`` gives it a fresh temporary profile every time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from playwright.sync_api import Browser, BrowserContext, Page, Route, expect, sync_playwright

CHROMIUM = os.environ.get("LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def _patience() -> float:
    """How many times longer than on an idle machine a wait may take: the load per
    core when the tests start (at least 1), or LAB_TEST_PATIENCE."""
    if os.environ.get("LAB_TEST_PATIENCE"):
        return max(1.0, float(os.environ["LAB_TEST_PATIENCE"]))
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


PATIENCE = _patience()


def ceiling_s(idle_seconds: float) -> float:
    """A wait's upper bound: generous on an idle machine (``idle_seconds``), longer
    on a busy one. Tests wait on conditions (Playwright's ``expect`` and
    ``wait_for_function``, poll loops on state) and return as soon as they hold;
    the ceiling only turns a hang into a failure."""
    return idle_seconds * PATIENCE


def ceiling_ms(idle_seconds: float) -> float:
    return ceiling_s(idle_seconds) * 1000


@contextmanager
def launch_chromium() -> Iterator[Browser]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class BrowserGuard:
    """Watches one browser context: requests to any host but this machine are
    aborted and recorded, console errors and uncaught page errors recorded.
    ``assert_clean()`` fails if anything was."""

    def __init__(self, context: BrowserContext):
        self.context = context
        self.external: list[str] = []
        self.console_errors: list[str] = []
        context.route("**/*", self._route)
        context.on("console", self._console)
        context.on("weberror", lambda error: self.console_errors.append(f"{error.error}"))

    def _route(self, route: Route) -> None:
        url = route.request.url
        if url.startswith(("data:", "blob:")) or urlsplit(url).hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            self.external.append(url)
            route.abort()

    def _console(self, message) -> None:
        if message.type == "error":
            self.console_errors.append(f"{message.text} ({message.location.get('url', '')})")

    def new_page(self) -> Page:
        return self.context.new_page()

    def assert_clean(self) -> None:
        assert not self.external, f"requests to other hosts: {self.external}"
        assert not self.console_errors, f"browser console errors: {self.console_errors}"


# --------------------------------------------------------------------------- live charts
# Points drawn by a Plotly chart: the longest x of its traces (typed arrays
# included, as plotly decodes them into _fullData), -1 before the first draw.
CHART_POINTS_JS = """el => {
  if (!el._fullData) return -1;
  let n = 0;
  for (const t of el._fullData) {
    const x = t.x || t.y;
    if (x && x.length > n) n = x.length;
  }
  return n;
}"""

# Every live chart of the page has been drawn at least once (a chart with nothing
# to draw is a placeholder card saying why: live.js, "chart-placeholder").
ALL_CHARTS_DRAWN_JS = """() => {
  const charts = Array.from(document.querySelectorAll('[data-live-chart]'));
  return charts.length > 0 && charts.every(el => el.classList.contains('chart-placeholder')
    || (el._fullLayout && el.querySelector('.main-svg')));
}"""

# Installed before the page's scripts: records, per chart, the number of
# points after every live update (live.js dispatches livechart:update on the
# chart element; a capturing listener on the document sees it).
RECORD_UPDATES_JS = """
window.__chartUpdates = {};
document.addEventListener('livechart:update', event => {
  const el = event.target;
  let n = 0;
  for (const t of (el._fullData || [])) { const x = t.x || t.y; if (x && x.length > n) n = x.length; }
  (window.__chartUpdates[el.id] = window.__chartUpdates[el.id] || []).push(n);
}, true);
"""

# A chart shows something: a trace with a drawn line segment or a marker.
TRACE_DRAWN_JS = """el => Array.from(el.querySelectorAll('.scatterlayer .trace')).some(t =>
  Array.from(t.querySelectorAll('path.js-line')).some(p => (p.getAttribute('d') || '').includes('L'))
  || t.querySelectorAll('.point').length > 0)"""


def chart_points(page: Page, chart_id: str) -> int:
    return page.locator(f"#{chart_id}").evaluate(CHART_POINTS_JS)


def wait_all_charts_drawn(page: Page, timeout_ms: float | None = None) -> None:
    page.wait_for_function(ALL_CHARTS_DRAWN_JS, timeout=timeout_ms or ceiling_ms(120))


def open_form_field(page: Page, path: str):
    """The run form's input of a dotted config path, its folded section opened
    first by clicking the section's summary, as a person would."""
    field = page.locator(f'[id="f-{path}"]')
    section = page.locator("details.form-section", has=field)
    if not section.evaluate("el => el.open"):
        section.locator("summary").first.click()
    return field


# Every drawn chart of the page checked against the layout rule
# (dashboard/charts/layout.py): the title, the axis titles and the legend clear of
# the plot area and of each other, all inside the chart; the legend within its
# bound; each numeric axis inside the physical bounds the chart states
# (layout.meta x_bounds / y_bounds) and no wider than its data plus a margin.
# Returns one line per problem, "" when all hold.
LAYOUT_PROBLEMS_JS = """(maxLegendPx) => {
  const problems = [];
  const box = el => { const r = el.getBoundingClientRect(); return {l: r.left, t: r.top, r: r.right, b: r.bottom, w: r.width, h: r.height}; };
  const overlap = (a, b) => a && b && a.w > 0 && b.w > 0 && a.l < b.r - 1 && b.l < a.r - 1 && a.t < b.b - 1 && b.t < a.b - 1;
  const inside = (a, o) => a.l >= o.l - 1 && a.r <= o.r + 1 && a.t >= o.t - 1 && a.b <= o.b + 1;
  for (const el of document.querySelectorAll('[data-live-chart]')) {
    if (!el._fullLayout) continue;
    const id = el.id;
    const chart = box(el.querySelector('.main-svg'));
    const plot = el.querySelector('.nsewdrag') ? box(el.querySelector('.nsewdrag')) : null;
    const parts = {title: el.querySelector('.gtitle'), ytitle: el.querySelector('.ytitle'),
                   xtitle: el.querySelector('.xtitle'), legend: el.querySelector('.legend')};
    const b = {};
    for (const [name, node] of Object.entries(parts)) if (node) b[name] = box(node);
    for (const [name, r] of Object.entries(b)) {
      if (r.w > 0 && !inside(r, chart)) problems.push(`${id}: ${name} outside the chart`);
      if (r.w > 0 && plot && name !== 'legend' && overlap(r, plot) && name === 'title')
        problems.push(`${id}: title over the plot`);
    }
    if (b.legend && b.legend.w > 0) {
      if (plot && overlap(b.legend, plot)) problems.push(`${id}: legend over the plot`);
      if (b.xtitle && overlap(b.legend, b.xtitle)) problems.push(`${id}: legend over the x title`);
      if (b.legend.h > maxLegendPx) problems.push(`${id}: legend ${Math.round(b.legend.h)} px tall`);
    }
    if (b.title && b.ytitle && overlap(b.title, b.ytitle)) problems.push(`${id}: title over the y title`);
    const meta = el._fullLayout.meta || {};
    for (const axis of ['x', 'y']) {
      const ax = el._fullLayout[axis + 'axis'];
      if (!ax || ax.type !== 'linear' || !ax.range) continue;
      const values = [];
      for (const t of el._fullData) {
        if (t.type === 'heatmap' || t.visible !== true) continue;
        for (const v of (t[axis] || [])) if (typeof v === 'number' && isFinite(v)) values.push(v);
      }
      if (!values.length) continue;
      const lo = Math.min(...values), hi = Math.max(...values);
      const span = Math.max(hi - lo, Math.abs(hi) * 0.2, 1e-9);
      const [r0, r1] = [Math.min(...ax.range), Math.max(...ax.range)];
      const bounds = meta[axis + '_bounds'] || [null, null];
      if (bounds[0] !== null && r0 < bounds[0] - 1e-9) problems.push(`${id}: ${axis} axis from ${r0} below ${bounds[0]}`);
      if (bounds[1] !== null && r1 > bounds[1] + 1e-9) problems.push(`${id}: ${axis} axis to ${r1} above ${bounds[1]}`);
      // the axis may reach down (or up) to the bound it states, as a collapse step's to 0
      const floor = bounds[0] !== null ? Math.min(bounds[0], lo - 0.6 * span) : lo - 0.6 * span;
      const ceil = bounds[1] !== null ? Math.max(bounds[1], hi + 0.6 * span) : hi + 0.6 * span;
      if (r0 < floor || r1 > ceil)
        problems.push(`${id}: ${axis} axis [${r0}, ${r1}] far past its data [${lo}, ${hi}]`);
    }
  }
  return problems.join('\\n');
}"""


def layout_problems(page: Page, max_legend_px: float) -> str:
    return page.evaluate(LAYOUT_PROBLEMS_JS, max_legend_px)


def log_in_as_the_demo_user(page: Page, lab) -> None:
    """The login page, as a newcomer after `make up`: the demo user and the
    password ``lab.demo_password`` (lab_up's ``_demo_user``), on ``lab.url``."""
    page.goto(f"{lab.url}/")
    page.get_by_label("Username").fill("demo")
    page.get_by_label("Password").fill(lab.demo_password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Experiments")).to_be_visible()
