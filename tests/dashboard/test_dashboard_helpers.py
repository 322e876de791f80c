"""Pure helpers behind the pages: config diff, page sections, windows, load matrices."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dashboard.charts.build import Window, layer_heatmap, load_matrix, run_lines, thin
from dashboard.charts.configdiff import MISSING, config_diff, display_value, flatten
from dashboard.charts.panels import chart_id, keys_for_runs, moe_layers, sections_for
from trainer.config.presets import preset_dict

PAGES_JS = (
    Path(__file__).resolve().parents[2] / "dashboard" / "web" / "static" / "dashboard" / "pages.js"
)


def test_flatten_gives_dotted_paths_with_lists_as_leaves():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}}) == {
        "a.b": 1,
        "a.c.d": [1, 2],
        "e": {},
    }


def test_config_diff_keeps_only_differing_fields():
    a = {"model": {"n_experts": 8, "top_k": 2}, "run": {"seed": 0}, "x": [1, 2]}
    b = {"model": {"n_experts": 8, "top_k": 1}, "run": {"seed": 1}, "x": [1, 2], "new": True}
    assert config_diff([a, b]) == [
        ("model.top_k", [2, 1]),
        ("new", [MISSING, True]),
        ("run.seed", [0, 1]),
    ]
    assert config_diff([a, a]) == []
    assert [display_value(v) for v in (MISSING, "r3", 1e-3, [1, 2], None)] == [
        "-",
        "r3",
        "0.001",
        "[1, 2]",
        "null",
    ]


def test_int_and_float_of_equal_value_are_a_difference():
    # 1 and 1.0 validate to the same number; still shown, since the stored configs differ
    assert config_diff([{"lr": 1}, {"lr": 1.0}]) == [("lr", [1, 1.0])]


def test_sections_leave_out_moe_keys_for_dense_models():
    moe, dense = preset_dict("moe-grpo"), preset_dict("dense-grpo")
    moe_keys = {k for s in sections_for(moe) for k in s.keys}
    dense_keys = {k for s in sections_for(dense) for k in s.keys}
    assert "mismatch/routing_inconsistency" in moe_keys
    assert "mismatch/routing_inconsistency" not in dense_keys
    assert "mismatch/kl_k3" in dense_keys
    assert [s.title for s in sections_for(dense)][:2] == [
        "Reward and accuracy",
        "Training-inference mismatch",
    ]
    assert "Router temperature" not in [s.title for s in sections_for(dense)]
    logged_only = sections_for(moe, ["reward/accuracy", "policy/grad_norm"])
    assert [(s.title, s.keys) for s in logged_only] == [
        ("Reward and accuracy", ("reward/accuracy",)),
        ("Gradients", ("policy/grad_norm",)),
    ]
    assert "experts/max_violation" in keys_for_runs([dense, moe])
    assert "experts/max_violation" not in keys_for_runs([dense])
    assert moe_layers(moe) == list(range(moe["model"]["n_layers"]))
    assert moe_layers(dense) == []
    assert chart_id("chart", "mismatch/kl_k3") == "chart-mismatch-kl_k3"


def test_window_validation_and_fetch_bounds():
    with pytest.raises(ValueError):
        Window(max_points=3)
    with pytest.raises(ValueError):
        Window(start=10, end=5)
    assert Window().fetch_bounds() == (None, None)
    assert Window(start=100, end=140).fetch_bounds() == (60, 180)
    assert Window(start=7, end=7).fetch_bounds() == (6, 8)
    assert Window(start=50).fetch_bounds() == (49, None)


def test_thin_treats_non_numbers_as_gaps_and_full_resolution_keeps_all():
    steps = list(range(10))
    values = [0.0, 1.0, None, "nan?", 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    x, y = thin(steps, values, Window(max_points=None))
    assert x.tolist() == steps
    assert np.isnan(y[2]) and np.isnan(y[3]) and y[4] == 4.0
    x, y = thin(steps, values, Window(max_points=None, start=4, end=6))
    assert x.tolist() == [3, 4, 5, 6, 7]


def test_load_matrix_puts_missing_steps_as_nan_columns():
    steps, z = load_matrix([0, 1, 2], [[0.5, 0.5], None, [1.0, 0.0]])
    assert steps.tolist() == [0, 1, 2]
    assert z.shape == (2, 3)
    assert z[:, 0].tolist() == [0.5, 0.5] and all(math.isnan(v) for v in z[:, 1])
    fig = layer_heatmap([0, 1, 2], [[0.5, 0.5], None, [1.0, 0.0]], 3, Window())
    assert fig.data[0].meta == {"layer": 3, "role": "expert_load"}
    assert fig.layout.uirevision == "experts/load"  # shared by every layer: zoom survives a switch


def test_run_lines_ignores_an_unknown_baseline_and_draws_a_message_without_data():
    fig = run_lines({"a": ([0, 1], [0.1, 0.2])}, "reward/accuracy", Window(), baseline="gone")
    assert [t.meta["role"] for t in fig.data] == ["run"]
    empty = run_lines({"a": ([], [])}, "reward/accuracy", Window())
    assert "no data yet" in empty.layout.annotations[0].text


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_pages_js_parses():
    subprocess.run([shutil.which("node"), "--check", str(PAGES_JS)], check=True)


def test_pages_js_writes_text_never_html():
    source = PAGES_JS.read_text(encoding="utf-8")
    assert "textContent" in source
    assert "innerHTML" not in source and "insertAdjacentHTML" not in source


def test_registry_specs_are_known_scalar_keys_in_known_sections():
    from trainer import metric_keys as mk

    assert set(mk.METRIC_SPECS) <= set(mk.SCALAR_KEYS)
    sections = {s.section for s in mk.METRIC_SPECS.values()} - {None}
    assert sections == set(mk.RUN_PAGE_SECTIONS)
    assert mk.metric_spec(mk.experts_load(2)).title == "expert load, layer 2"
    assert mk.metric_spec("some/new_key").title == "some/new_key"
    share = mk.metric_spec(mk.REWARD_ACCURACY)
    assert (share.axis_format, share.hover_format) == (".0%", ".2%")


def test_axis_and_hover_formats_come_from_the_registry(monkeypatch):
    from dashboard.charts.figures import metric_lines
    from trainer import metric_keys as mk

    spec = mk.MetricSpec("time/step_s", "step time", "s", log_scale=True)
    monkeypatch.setitem(mk.METRIC_SPECS, spec.key, spec)
    fig = metric_lines({"run": ([0, 1], [0.5, 2.0])}, spec.key)
    assert fig.layout.yaxis.type == "log"
    assert fig.layout.yaxis.title.text == "step time (s)"
    assert fig.data[0].hovertemplate == "%{y:.4g}"
    share = metric_lines({"run": ([0, 1], [0.5, 0.6])}, mk.REWARD_ACCURACY)
    assert share.layout.yaxis.tickformat == ".0%" and share.layout.yaxis.rangemode == "nonnegative"
