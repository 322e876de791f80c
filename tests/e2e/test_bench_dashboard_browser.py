"""bench/bench_dashboard_browser.py runs end to end on a small page.

In a subprocess: the benchmark configures Django on its own throwaway
database, which must not meet this test session's settings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from browser_harness import ceiling_s

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(ceiling_s(300))]

ROOT = Path(__file__).resolve().parents[2]


def test_small_compare_page_is_timed_and_downsampling_shrinks_the_payload(tmp_path, chromium):
    out = tmp_path / "dashboard_browser.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_dashboard_browser", "--runs", "2", "--steps", "1200",
         "--metrics", "2", "--repeat", "1", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=ceiling_s(280),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "first chart s" in done.stdout and "targets" in done.stdout
    result = json.loads(out.read_text())
    rows = {row["mode"]: row for row in result["rows"]}
    assert rows["downsampled"]["payload_mb"] < rows["full"]["payload_mb"]
    for row in rows.values():
        assert 0 < row["first_chart_s"] <= row["all_charts_s"]
        assert row["server_ms"] > 0
