#!/usr/bin/env python
"""Screenshots of the dashboards from REAL training runs, for docs/screenshots/.

Run against a lab that holds finished runs, e.g. the `make up` demo once its
runs are done:

    .venv/bin/python scripts/real_screenshots.py --url http://127.0.0.1:8000 \\
        --experiment "Demo: MoE collapse against rollout precision, R3 and dense"

The login defaults to the demo's (var/demo-login.txt). Each picture is written
as docs/screenshots/real-<page>.png (256-colour palette, as the browser tests'
copies) and carries a small caption naming the experiment and the date it was
taken, so a reader can tell it from the synthetic-fixture pictures the browser
tests take (those carry a red banner).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import urllib.parse
from pathlib import Path

from PIL import Image
from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip
ALL_CHARTS_DRAWN_JS = """() => {
  const charts = Array.from(document.querySelectorAll('[data-live-chart]'));
  return charts.every(el => el.classList.contains('chart-placeholder')
    || (el._fullLayout && el.querySelector('.main-svg')));
}"""
CAPTION_JS = """text => {
  const note = document.createElement('div');
  note.textContent = text;
  note.style.cssText = 'position:absolute;top:44px;right:0;z-index:99999;padding:3px 8px;'
    + 'background:#1d4ed8;color:#fff;font:12px sans-serif;opacity:0.9';
  document.body.appendChild(note);
}"""


def _api(page: Page, url: str, path: str):
    return json.loads(page.request.get(f"{url}{path}").text())


def _shoot(page: Page, name: str, caption: str, full_page: bool = False) -> Path:
    page.wait_for_function(ALL_CHARTS_DRAWN_JS, timeout=60_000)
    page.evaluate(CAPTION_JS, caption)
    raw = OUT / f".real-{name}.raw.png"
    page.screenshot(path=str(raw), full_page=full_page)
    path = OUT / f"real-{name}.png"
    with Image.open(raw) as image:
        image.convert("RGB").quantize(256).save(path, optimize=True)
    raw.unlink()
    print(f"wrote {path.relative_to(ROOT)}")
    return path


def take(url: str, username: str, password: str, experiment_name: str) -> list[Path]:
    OUT.mkdir(parents=True, exist_ok=True)
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("needs Debian's chromium (scripts/ensure-test-deps installs it)")
    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/accounts/login/")
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_load_state()
        experiments = _api(page, url, "/api/experiments")
        items = experiments.get("results", experiments)
        match = [e for e in items if e["name"] == experiment_name]
        if not match:
            sys.exit(f"no experiment named {experiment_name!r}")
        exp = match[0]["id"]
        runs = _api(page, url, f"/api/runs?experiment={exp}&limit=200")
        runs = [r for r in runs.get("results", runs) if r["status"] == "succeeded"]
        if not runs:
            sys.exit("the experiment has no finished run yet")
        caption = f"real runs: {experiment_name}, {datetime.date.today().isoformat()}"

        page.goto(f"{url}/stability/?experiment={exp}")
        written.append(_shoot(page, "stability", caption, full_page=True))
        page.goto(f"{url}/experiments/{exp}/")
        written.append(_shoot(page, "experiment", caption))
        collapsed = [r for r in runs if (r.get("summary") or {}).get("collapsed")]
        run = (collapsed or runs)[0]
        page.goto(f"{url}/runs/{run['id']}/")
        written.append(_shoot(page, "run-page", caption, full_page=True))
        by_variant = {}
        for r in runs:
            by_variant.setdefault(r.get("variant") or str(r["id"]), r)
        pair = list(by_variant.values())[:2]
        if len(pair) == 2:
            ids = ",".join(str(r["id"]) for r in pair)
            page.goto(f"{url}/compare/?runs={urllib.parse.quote(ids)}")
            written.append(_shoot(page, "compare", caption))
        browser.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--username", default="demo")
    parser.add_argument("--password", default=None, help="default: var/demo-login.txt")
    args = parser.parse_args()
    password = args.password
    if password is None:
        password = (ROOT / "var" / "demo-login.txt").read_text().strip()
    take(args.url.rstrip("/"), args.username, password, args.experiment)


if __name__ == "__main__":
    main()
