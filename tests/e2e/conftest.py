"""Fixtures for the browser tests: Debian's headless chromium driven by Playwright.

``playwright install`` cannot download browsers here, so the tests launch the
system chromium (``scripts/ensure-test-deps`` installs it; LAB_CHROMIUM
overrides the path). Every test gets a fresh browser context whose requests
are intercepted: anything not addressed to this machine is aborted and fails
the test, as does any console error or uncaught page error.

Waits: every wait is on a condition with a ceiling that grows with the
machine's load (``browser_harness.ceiling_s``; LAB_TEST_PATIENCE=N sets the
factor), so the suite passes on a machine several times oversubscribed.

Screenshots go to ``test-artifacts/e2e/`` (git-ignored). With
LAB_UPDATE_DOCS_SCREENSHOTS=1 the representative ones are also copied into
``docs/screenshots/`` for docs/dashboards.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_harness import CHROMIUM, PATIENCE, BrowserGuard, ceiling_ms, launch_chromium
from PIL import Image
from playwright.sync_api import expect

ROOT = Path(__file__).resolve().parents[2]
# Every Playwright wait is on a condition; these are its ceilings (5 s is
# Playwright's own default for expect, which a loaded machine misses).
expect.set_options(timeout=ceiling_ms(60))
ARTIFACTS = ROOT / "test-artifacts" / "e2e"
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"


@pytest.fixture(scope="session")
def chromium():
    """One headless chromium per test session (a fresh temporary profile)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}: run scripts/ensure-test-deps")
    # Playwright's sync API keeps an asyncio loop in this thread; the tests use
    # the ORM only to set up data, between browser calls, never inside them.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with launch_chromium() as browser:
        yield browser


@pytest.fixture
def guard(chromium) -> Iterator[BrowserGuard]:
    """A fresh context (own cookies) that fails the test on console errors,
    page errors and requests to any other host."""
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(ceiling_ms(60))
    watched = BrowserGuard(context)
    try:
        yield watched
    finally:
        context.close()
    watched.assert_clean()


@pytest.fixture(scope="session", autouse=True)
def flush_waits_for_the_live_server():
    """The flush that ends a ``transactional_db`` test retries while the live server
    still reads (``live_db.retry_while_locked``): a page's last poll, still in flight
    when the test ends, failed the flush, and the next test found the last one's rows."""
    from django.test import TransactionTestCase
    from live_db import retry_while_locked

    flush = TransactionTestCase._fixture_teardown
    TransactionTestCase._fixture_teardown = lambda self: retry_while_locked(lambda: flush(self))
    yield
    TransactionTestCase._fixture_teardown = flush


SYNTHETIC_BANNER_JS = """() => {
  const banner = document.createElement('div');
  banner.id = 'synthetic-banner';
  banner.textContent = 'SYNTHETIC FIXTURE DATA: shows the page, not a training result';
  banner.style.cssText = 'position:fixed;top:0;left:0;right:0;z-index:99999;padding:6px;'
    + 'background:#b42318;color:#fff;font:bold 15px sans-serif;text-align:center';
  document.body.appendChild(banner);
}"""


class Screenshots:
    """Viewport screenshots (1280x800 PNG) kept as test artifacts."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def take(
        self,
        page,
        name: str,
        *,
        docs: bool = False,
        synthetic: bool = False,
        full_page: bool = False,
    ) -> Path:
        """``synthetic``: the page shows fixture data, not a training run; the
        picture says so on its face (a banner drawn for the screenshot only).
        ``full_page``: the whole page, not the 1280x800 viewport."""
        path = ARTIFACTS / f"{self.prefix}-{name}.png"
        if synthetic:
            page.evaluate(SYNTHETIC_BANNER_JS)
        page.screenshot(path=str(path), full_page=full_page)
        if synthetic:
            page.evaluate("document.getElementById('synthetic-banner').remove()")
        if docs and os.environ.get("LAB_UPDATE_DOCS_SCREENSHOTS") == "1":
            DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            # A 256-colour palette keeps the committed copies at a third of the size.
            with Image.open(path) as image:
                image.convert("RGB").quantize(256).save(
                    DOCS_SCREENSHOTS / f"{name}.png", optimize=True
                )
        return path


@pytest.fixture
def screenshots(request) -> Screenshots:
    return Screenshots(request.module.__name__.removeprefix("test_"))


def pytest_report_header(config):
    return f"e2e wait ceilings x{PATIENCE:.1f} (load per core; LAB_TEST_PATIENCE overrides)"
