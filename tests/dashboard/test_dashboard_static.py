"""plotly.js from the Python package, no CDN; live.js; and no ORM in the builders."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import plotly
import pytest
from django.contrib.staticfiles import finders
from django.template.loader import render_to_string
from django.test import override_settings

from dashboard.web.staticfiles import STATIC_PATH, PlotlyJsFinder, plotly_js_path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboard"
LIVE_JS = DASHBOARD / "web" / "static" / "dashboard" / "live.js"


def test_finder_resolves_plotly_js_from_the_installed_package():
    found = finders.find(STATIC_PATH)
    assert found is not None
    assert Path(found) == plotly_js_path()
    assert Path(found).is_relative_to(Path(plotly.__file__).resolve().parent)
    head = Path(found).read_text(encoding="utf-8", errors="replace")[:2_000]
    assert plotly.offline.get_plotlyjs_version() in head  # the same plotly.js the figures target
    assert finders.find(STATIC_PATH, find_all=True) == [found]


def test_finder_exposes_only_plotly_js():
    finder = PlotlyJsFinder()
    assert finder.check() == []
    assert finder.find("dashboard/other.js") is None
    assert finder.find("plotly.min.js") is None
    listed = list(finder.list(None))
    assert [(path, storage.prefix) for path, storage in listed] == [("plotly.min.js", "dashboard")]
    assert list(finder.list(["*.js"])) == []


def test_plotly_js_is_not_copied_into_the_repository():
    assert not list(ROOT.glob("dashboard/**/plotly*.min.js"))


@override_settings(STATIC_URL="/static/")
def test_template_loads_local_plotly_and_live_js():
    html = render_to_string("dashboard/_plotly_scripts.html")
    assert 'src="/static/dashboard/plotly.min.js"' in html
    assert 'src="/static/dashboard/live.js"' in html


def test_live_chart_partial_points_live_js_at_the_endpoint():
    html = render_to_string("dashboard/_live_chart.html", {"chart_id": "kl", "url": "/runs/7/kl"})
    assert 'data-live-chart data-url="/runs/7/kl"' in html
    assert 'data-max-points="500"' in html
    assert "/runs/7/kl?format=csv" in html and "/runs/7/kl?format=json" in html


CDN_PATTERN = re.compile(
    r"cdn\.plot\.ly|cdn\.jsdelivr|unpkg\.com|cdnjs\.|include_plotlyjs\s*=\s*['\"]cdn|https?://[^\s'\"]*cdn",
    re.IGNORECASE,
)


def test_no_code_or_template_references_a_cdn():
    checked = [
        p
        for p in DASHBOARD.rglob("*")
        if p.is_file() and p.suffix in {".py", ".html", ".js", ".css"} and p.name != "plotly.min.js"
    ]
    assert LIVE_JS in checked and len(checked) > 5
    offenders = [str(p) for p in checked if CDN_PATTERN.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_figure_builders_import_no_django():
    code = (
        "import sys, dashboard.charts.figures, dashboard.charts.downsample, dashboard.charts.survival,"
        " dashboard.charts.export, dashboard.charts.stability, dashboard.charts.aggregate,"
        " dashboard.charts.build, dashboard.charts.panels, dashboard.charts.configdiff;"
        "bad = [m for m in sys.modules if m == 'django' or m.startswith('django.')];"
        "assert not bad, bad"
    )
    # This checkout's lab (the downsampler lives there), not an installed one.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "platform")])}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)


# ------------------------------------------------------------------- live.js

NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")


@needs_node
def test_live_js_parses():
    subprocess.run([NODE, "--check", str(LIVE_JS)], check=True)


@needs_node
def test_live_js_window_and_url_logic():
    script = f"""
    const live = require({json.dumps(str(LIVE_JS))});
    const out = {{
      zoom: live.visibleWindow({{"xaxis.range[0]": 10.4, "xaxis.range[1]": 99.6}}),
      zoomArray: live.visibleWindow({{"xaxis.range": [5, 6]}}),
      autoscale: live.visibleWindow({{"xaxis.autorange": true}}),
      legendClick: live.visibleWindow({{"hiddenlabels": ["r1"]}}),
      yOnly: live.visibleWindow({{"yaxis.range[0]": 0, "yaxis.range[1]": 1}}),
      url: live.chartUrl("/runs/7/kl?keys=a", 500, [10.4, 99.6], "http://lab.test/runs/7"),
      reversed: live.chartUrl("/c", 100, [99.6, 10.4], "http://lab.test/"),
      full: live.chartUrl("/c?start=1&end=2", 500, null, "http://lab.test/"),
    }};
    process.stdout.write(JSON.stringify(out));
    """
    result = subprocess.run([NODE, "-e", script], check=True, capture_output=True, text=True)
    out = json.loads(result.stdout)
    assert out["zoom"] == [10.4, 99.6]
    assert out["zoomArray"] == [5, 6]
    assert out["autoscale"] is None
    assert "legendClick" not in out and "yOnly" not in out  # undefined: not a window change
    assert out["url"] == "http://lab.test/runs/7/kl?keys=a&max_points=500&start=10&end=100"
    assert out["reversed"] == "http://lab.test/c?max_points=100&start=10&end=100"
    assert out["full"] == "http://lab.test/c?max_points=500"


def test_live_js_uses_plotly_react_and_relayout():
    source = LIVE_JS.read_text(encoding="utf-8")
    assert "Plotly.react(" in source and "plotly_relayout" in source
    assert "import " not in source and "require(" not in source  # dependency-free
