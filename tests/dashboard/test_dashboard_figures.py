import json
import math

import numpy as np
import pytest

from dashboard.charts.aggregate import aggregate_seeds, on_grid
from dashboard.charts.export import figure_data
from dashboard.charts.figures import (
    CollapseMarker,
    collapse_strip,
    empty_figure,
    expert_heatmap,
    expert_heatmap_layers,
    metric_lines,
    seed_band,
    survival_curves,
)
from dashboard.charts.layout import ROW_PX, fit_layout
from dashboard.charts.style import (
    BASELINE_COLOR,
    PALETTE,
    assign_colors,
    metric_title,
    stable_color,
)
from dashboard.charts.survival import RunOutcome
from trainer import metric_keys as mk

STEPS = np.arange(0, 50, 10)  # 0 10 20 30 40


def _by_name(fig):
    return {t.name: t for t in fig.data}


# ----------------------------------------------------------------- metric_lines


def test_metric_lines_overlays_runs_with_page_colours():
    colors = {"r1": "#1f5fa8", "r2": "#c0392b"}
    fig = metric_lines(
        {"r1": (STEPS, [1, 2, 3, 4, 5]), "r2": (STEPS, [5, 4, 3, 2, 1])},
        mk.POLICY_GRAD_NORM,
        colors=colors,
    )
    traces = _by_name(fig)
    assert list(traces) == ["r1", "r2"]
    assert traces["r1"].x.tolist() == STEPS.tolist()
    assert traces["r2"].y.tolist() == [5, 4, 3, 2, 1]
    assert traces["r1"].line.color == "#1f5fa8" and traces["r2"].line.color == "#c0392b"
    assert fig.layout.hovermode == "x unified"
    assert fig.layout.uirevision == mk.POLICY_GRAD_NORM  # constant: live updates keep zoom
    assert fig.layout.yaxis.title.text == metric_title(mk.POLICY_GRAD_NORM)
    assert fig.layout.xaxis.title.text == "step"


def test_metric_lines_draws_the_baseline_first_black_and_dashed():
    fig = metric_lines(
        {"r1": (STEPS, [1] * 5), "pinned": (STEPS, [2] * 5)}, mk.REWARD_MEAN, baseline="pinned"
    )
    first = fig.data[0]
    assert first.name == "pinned (baseline)"
    assert first.line.color == BASELINE_COLOR and first.line.dash == "dash"
    assert first.line.width > fig.data[1].line.width
    assert fig.data[1].line.dash is None
    with pytest.raises(ValueError, match="baseline"):
        metric_lines({"r1": (STEPS, [1] * 5)}, mk.REWARD_MEAN, baseline="missing")


def test_metric_lines_marks_the_collapse_step_with_its_reason():
    fig = metric_lines(
        {"r1": (STEPS, [0.9, 0.8, 0.2, 0.1, 0.0]), "r2": (STEPS, [0.5] * 5)},
        mk.REWARD_ACCURACY,
        collapse_markers={"r1": CollapseMarker(25, "accuracy below 50% of best for 10 steps")},
    )
    (line,) = fig.layout.shapes
    assert line.x0 == line.x1 == 25 and line.yref == "y domain"  # full height
    (note,) = fig.layout.annotations
    assert note.text == "r1: collapse @ 25"
    assert "accuracy below 50% of best" in note.hovertext
    marker = _by_name(fig)["r1 collapse"]
    assert marker.x == (25,) and marker.y == (0.2,)  # on the curve, last value at or before 25
    assert "accuracy below 50% of best" in marker.hovertemplate
    assert marker.legendgroup == "r1"  # hiding the run hides its marker
    assert fig.layout.yaxis.tickformat == ".0%"  # accuracy is a share
    assert fig.layout.yaxis.rangemode == "nonnegative"  # a share is never below 0


def test_collapse_marker_accepts_plain_tuples_and_skips_unknown_runs():
    fig = metric_lines(
        {"r1": (STEPS, [1.0, None, None, None, None])},
        mk.POLICY_GRAD_NORM,
        collapse_markers={"r1": (30, "non-finite gradient"), "gone": (5, "x")},
    )
    assert len(fig.layout.shapes) == 1
    assert _by_name(fig)["r1 collapse"].y == (1.0,)


# ------------------------------------------------------------------ seed bands


def test_aggregate_seeds_by_hand():
    seeds = [(STEPS, [1.0, 2.0, 3.0, 4.0, 5.0]), (STEPS, [3.0, 2.0, 1.0, 0.0, 1.0])]
    agg = aggregate_seeds(seeds, "minmax")
    assert agg.mean.tolist() == [2.0, 2.0, 2.0, 2.0, 3.0]
    assert agg.lower.tolist() == [1.0, 2.0, 1.0, 0.0, 1.0]
    assert agg.upper.tolist() == [3.0, 2.0, 3.0, 4.0, 5.0]
    std = aggregate_seeds(seeds, "std")
    # sample std of {1, 3} is sqrt(2); of {5, 1} is sqrt(8)
    np.testing.assert_allclose(
        std.upper - std.mean, [math.sqrt(2), 0, math.sqrt(2), math.sqrt(8), math.sqrt(8)]
    )


def test_seeds_on_different_steps_are_interpolated_inside_their_range():
    grid = np.array([0.0, 5.0, 10.0, 20.0])
    out = on_grid(([0, 10], [0.0, 1.0]), grid)
    assert out[:3].tolist() == [0.0, 0.5, 1.0] and math.isnan(out[3])
    agg = aggregate_seeds([([0, 10], [0.0, 1.0]), ([0, 10, 20], [2.0, 2.0, 2.0])])
    assert agg.steps.tolist() == [0, 10, 20]
    assert agg.count.tolist() == [2, 2, 1]  # the first seed stopped at step 10
    assert agg.mean.tolist() == [1.0, 1.5, 2.0]


def test_seed_band_traces():
    seeds = {"grpo": [(STEPS, [1.0, 2, 3, 4, 5]), (STEPS, [3.0, 2, 1, 0, 1])]}
    fig = seed_band(seeds, mk.REWARD_MEAN, colors={"grpo": "#1e7d45"})
    roles = [t.meta["role"] for t in fig.data]
    assert roles == ["seed", "seed", "band_lower", "band_upper", "mean"]
    lower, upper, mean = fig.data[2], fig.data[3], fig.data[4]
    assert upper.fill == "tonexty" and lower.fill is None  # band between lower and upper
    assert upper.fillcolor == "rgba(30,125,69,0.18)"
    assert mean.y.tolist() == [2.0, 2.0, 2.0, 2.0, 3.0] and mean.name == "grpo"
    assert mean.customdata.tolist() == [2, 2, 2, 2, 2]
    assert all(t.line.color == "#1e7d45" for t in fig.data)
    assert all(t.showlegend is False for t in fig.data[:4])  # one legend entry per variant
    assert fig.data[0].line.width < mean.line.width
    assert "min-max" in fig.layout.title.text and fig.layout.hovermode == "x unified"
    assert "std" in seed_band(seeds, mk.REWARD_MEAN, band="std").layout.title.text


def test_seed_band_downsampling_keeps_a_spike_in_the_band():
    steps = np.arange(5_000)
    quiet = np.full(5_000, 0.001)
    spiky = quiet.copy()
    spiky[4_321] = 0.2
    fig = seed_band({"v": [(steps, quiet), (steps, spiky)]}, mk.POLICY_GRAD_NORM, max_points=200)
    traces = {t.meta["role"]: t for t in fig.data if t.meta["role"] != "seed"}
    assert len(traces["mean"].x) <= 200
    assert traces["band_upper"].y.max() == 0.2
    assert all(len(t.x) <= 200 for t in fig.data)


# -------------------------------------------------------------------- heatmaps


def test_expert_heatmap_is_experts_by_steps():
    load = np.array([[0.7, 0.25, 0.25], [0.1, 0.25, 0.25], [0.1, 0.25, 0.25], [0.1, 0.25, 0.25]])
    fig = expert_heatmap([1, 2, 3], load, layer=2)
    (trace,) = fig.data
    assert trace.type == "heatmap"
    assert np.asarray(trace.z).shape == (4, 3)
    assert trace.x.tolist() == [1, 2, 3] and trace.y.tolist() == [0, 1, 2, 3]
    assert trace.zmin == 0.0
    assert "25.0%" in trace.colorbar.title.text  # balanced load for 4 experts
    assert fig.layout.title.text == "Expert load, layer 2"
    assert fig.layout.uirevision == mk.experts_load(2)
    assert trace.zmax is None  # this run's own range
    with pytest.raises(ValueError, match="experts"):
        expert_heatmap([1, 2], load, layer=0)


def test_expert_heatmaps_compared_side_by_side_share_a_fixed_scale():
    """0 to 4x balanced load, whatever the run's own maximum (capped at 100%)."""
    near_balanced = np.full((8, 2), 0.125)
    (trace,) = expert_heatmap([0, 1], near_balanced, layer=0, shared_scale=True).data
    assert (trace.zmin, trace.zmax) == (0.0, 0.5)
    (two_experts,) = expert_heatmap([0], np.array([[0.9], [0.1]]), 0, shared_scale=True).data
    assert two_experts.zmax == 1.0


def test_expert_heatmap_layer_picker():
    load = np.full((2, 3), 0.5)
    fig = expert_heatmap_layers({0: ([1, 2, 3], load), 1: ([1, 2, 3], load)})
    assert [t.visible for t in fig.data] == [True, False]
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["layer 0", "layer 1"]
    assert buttons[1].args[0] == {"visible": [False, True]}
    assert buttons[1].args[1] == {"title.text": "Expert load, layer 1"}


# --------------------------------------------------------- collapse and survival


def test_collapse_strip_draws_censored_seeds_as_lower_bounds():
    outcomes = {
        "moe-grpo": [
            RunOutcome("moe-grpo", 300, True, seed=0),
            RunOutcome("moe-grpo", 500, True, seed=1),
        ],
        "moe-grpo-r3": [
            RunOutcome("moe-grpo-r3", 800, True, seed=0),
            RunOutcome("moe-grpo-r3", 2000, False, seed=1),
        ],
    }
    fig = collapse_strip(outcomes)
    traces = _by_name(fig)
    assert fig.layout.yaxis.ticktext == ("moe-grpo", "moe-grpo-r3")  # a row per variant
    collapsed = traces["moe-grpo: collapsed"]
    assert collapsed.x == (300, 500) and collapsed.marker.symbol == "circle"
    assert collapsed.text is None
    censored = traces["moe-grpo-r3: censored"]
    assert censored.x == (2000,)
    assert censored.marker.symbol == "triangle-right-open"  # open: not an observed collapse
    assert censored.text == (">= 2000",)
    assert "censored" in censored.hovertext[0] and "seed 1" in censored.hovertext[0]
    assert traces["moe-grpo: mean"].text == ("400",)
    assert traces["moe-grpo-r3: mean"].text == (">= 1400",)
    assert traces["moe-grpo-r3: mean"].x == (1400.0,)
    # seeds of one variant sit side by side within its row
    assert all(0.5 < y < 1.5 for y in traces["moe-grpo-r3: collapsed"].y + censored.y)


def test_collapse_strip_draws_one_label_per_censored_step_and_exports_each():
    """Three seeds censored at the same step sit side by side: one drawn ">= N"
    (equal labels would print over each other), three in the download; the
    mean's label is drawn right of every seed and is not a data row."""
    outcomes = {"r3": [RunOutcome("r3", 299, False, seed=s) for s in range(3)]}
    fig = collapse_strip(outcomes)
    traces = _by_name(fig)
    censored = traces["r3: censored"]
    assert censored.text == ("", ">= 299", "")
    label = traces["r3: mean label"]
    assert label.mode == "text" and label.text == ("mean >= 299",)
    assert label.y[0] > max(censored.y)  # under the seeds (the rows run downwards)
    data = figure_data(fig)
    assert [t["name"] for t in data["traces"]] == ["r3: censored", "r3: mean"]
    assert data["traces"][0]["text"] == [">= 299"] * 3


def test_survival_curves_values_and_censor_ticks():
    events = [(100, True), (200, False), (300, True), (300, False), (400, True)]
    fig = survival_curves({"moe-grpo": events, "dense": [(500, False)]})
    traces = _by_name(fig)
    curve = traces["moe-grpo (3/5 collapsed)"]
    assert curve.line.shape == "hv"
    assert curve.x == (0, 100, 200, 300, 400)
    assert curve.y == pytest.approx((1.0, 0.8, 0.8, 8 / 15, 0.0))
    ticks = traces["moe-grpo censored"]
    assert ticks.x == (200, 300) and ticks.y == pytest.approx((0.8, 8 / 15))
    assert traces["dense (0/1 collapsed)"].y == (1.0, 1.0)
    assert fig.layout.yaxis.tickformat == ".0%"


# ----------------------------------------------------------------- style, misc


def _relative_luminance(hex_color: str) -> float:
    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


@pytest.mark.parametrize("color", [*PALETTE, BASELINE_COLOR])
def test_every_colour_is_readable_on_white(color):
    contrast = (1.0 + 0.05) / (_relative_luminance(color) + 0.05)
    assert contrast >= 3.0, f"{color} has contrast {contrast:.2f} on white (WCAG 1.4.11 wants 3)"


def test_colour_assignment_is_distinct_and_keeps_existing():
    colors = assign_colors(["a", "b", "c"])
    assert len(set(colors.values())) == 3
    more = assign_colors(["c", "d"], existing=colors)
    assert more["c"] == colors["c"] and more["d"] not in colors.values()
    many = assign_colors([f"run{i}" for i in range(30)])
    assert len(set(list(many.values())[: len(PALETTE)])) == len(PALETTE)
    assert stable_color("x") == stable_color("x")


def test_figures_serialise_to_json_without_plotly_default_template():
    fig = metric_lines({"r": (STEPS, [1.0, None, 3.0, 4.0, 5.0])}, mk.MISMATCH_KL_K3)
    payload = json.loads(fig.to_json())
    assert payload["layout"]["template"]["layout"]["plot_bgcolor"] == "#ffffff"
    assert "data" not in payload["layout"]["template"]  # not plotly's big default
    assert len(fig.to_json()) < 3_000
    assert empty_figure("no runs selected").layout.annotations[0].text == "no runs selected"


def test_short_runs_get_one_tick_per_step():
    """Steps are whole numbers: a 4-step run is not labelled 0.5, 1.5, ..."""
    short = metric_lines({"r": ([0, 1, 2, 3], [0.1, 0.2, 0.3, 0.4])}, mk.REWARD_MEAN)
    assert (short.layout.xaxis.dtick, short.layout.xaxis.tick0) == (1, 0)
    long = metric_lines({"r": (list(range(200)), [0.0] * 200)}, mk.REWARD_MEAN)
    assert long.layout.xaxis.dtick is None  # Plotly's own spacing
    band = seed_band({"v": [([0, 1, 2], [1.0, 2.0, 3.0])]}, mk.REWARD_MEAN)
    assert band.layout.xaxis.dtick == 1
    heat = expert_heatmap([0, 1], np.full((2, 2), 0.5), layer=0)
    assert heat.layout.xaxis.dtick == 1


def test_kl_is_drawn_in_the_tables_unit_never_with_si_prefixes():
    """One notation: the chart's KL axis and values are ×1e-3, like the stability table."""
    fig = metric_lines({"r": (STEPS, [4e-5, 5e-5, 6e-5, 5e-5, 4e-5])}, mk.MISMATCH_KL_K3)
    assert fig.layout.yaxis.title.text == "training-inference KL (k3) (×1e-3)"
    np.testing.assert_allclose(fig.data[0].y, [0.04, 0.05, 0.06, 0.05, 0.04])
    band = seed_band({"v": [(STEPS, [2e-3] * 5)]}, mk.MISMATCH_KL_K3)
    mean = next(t for t in band.data if t.meta["role"] == "mean")
    np.testing.assert_allclose(mean.y, [2.0] * 5)
    assert fig.layout.template.layout.yaxis.exponentformat == "e"  # never "40μ"
    from dashboard.charts.stability import STABILITY_COLUMNS

    assert ("kl_k3_x1e3", "training-inference KL (×1e-3)") in STABILITY_COLUMNS


def test_percent_ticks_have_the_decimals_the_range_needs():
    from dashboard.charts.style import share_tickformat

    assert share_tickformat([[0.0, 0.012]]) == ".1%"  # 0%, 0.2%, ... not 0%, 0%, 1%
    assert share_tickformat([[0.1, 0.9]]) == ".0%"
    assert share_tickformat([[0.0, 0.0004]]) == ".3%"
    assert share_tickformat([[np.nan]]) == ".0%"
    fig = metric_lines({"r": (STEPS, [0.001, 0.004, 0.008, 0.01, 0.012])}, mk.REWARD_ACCURACY)
    assert fig.layout.yaxis.tickformat == ".1%"


def test_legend_sits_below_the_plot():
    fig = metric_lines({"a-very-long-run-name-" * 4: (STEPS, [1.0] * 5)}, mk.REWARD_MEAN)
    assert fig.layout.legend.y < 0 and fig.layout.legend.yanchor == "top"


def test_an_empty_chart_is_a_placeholder_card():
    fig = empty_figure("accuracy: waiting for the first step")
    assert fig.layout.meta == {"placeholder": "accuracy: waiting for the first step"}


def test_a_constant_series_keeps_its_axis_in_range():
    """Plotly pads a flat line by its own value: a constant 100% accuracy would get
    an axis to 200%. A share keeps [0, 100%]; another metric its value +-10%."""
    full = metric_lines({"run": (STEPS, [1.0] * 5)}, mk.REWARD_ACCURACY)
    assert list(full.layout.yaxis.range) == [0.0, 1.0]
    band = seed_band({"v": [(STEPS, [1.0] * 5), (STEPS, [1.0] * 5)]}, mk.REWARD_ACCURACY)
    assert list(band.layout.yaxis.range) == [0.0, 1.0]
    flat = metric_lines({"run": (STEPS, [2.0] * 5)}, mk.REWARD_MEAN)
    assert list(flat.layout.yaxis.range) == pytest.approx([1.8, 2.2])
    moving = metric_lines({"run": (STEPS, [0.1, 0.2, 0.3, 0.4, 0.5])}, mk.REWARD_ACCURACY)
    assert moving.layout.yaxis.range is None  # Plotly's autorange when the values move


def test_long_tick_labels_push_the_axis_title_aside():
    """KL's e-notation ticks are long: the y title moves out instead of overlapping."""
    fig = metric_lines({"run": (STEPS, [1e-7, 2e-7, 3e-7, 4e-7, 5e-7])}, mk.MISMATCH_KL_K3)
    assert fig.layout.yaxis.automargin is True


def test_collapse_strip_names_its_rows_and_keys_only_its_marks():
    """Eight variants with long names: a row each, named beside it (wrapped), the
    chart as tall as its rows; the legend is the key to the two marks only (the
    rows name the variants), and ">= N" labels are drawn, not clipped."""
    names = [f"rollout.router_noise={i / 10}, stabilizers.replay.mode=r3" for i in range(8)]
    outcomes = {n: [RunOutcome(n, step=150, collapsed=False, label="s0")] for n in names}
    fig = collapse_strip(outcomes)
    assert all("<br>" in tick for tick in fig.layout.yaxis.ticktext)
    assert fig.layout.meta["rows"] == 8
    shown = [t.name for t in fig.data if t.showlegend is not False]
    assert shown == ["collapsed", "never collapsed (censored)"]
    censored = [t for t in fig.data if t.meta["role"] == "censored"]
    assert censored and all(t.cliponaxis is False for t in censored)
    assert all(t.text[0] == ">= 150" for t in censored)
    laid_out = fit_layout(fig)
    assert laid_out.layout.height >= 8 * ROW_PX


def test_kl_ticks_speak_the_titles_scale_only():
    """A tiny KL drawn ×1e-3 (0.0004) gets decimal ticks, not "4e-4" under a
    "×1e-3" title (two scales on one axis)."""
    fig = metric_lines({"r": (STEPS, [4e-7, 5e-7, 6e-7, 5e-7, 4e-7])}, mk.MISMATCH_KL_K3)
    assert "×1e-3" in fig.layout.yaxis.title.text
    assert fig.layout.yaxis.tickformat == "~r"
    band = seed_band({"v": [(STEPS, [4e-7, 5e-7, 6e-7, 5e-7, 4e-7])]}, mk.MISMATCH_KL_K3)
    assert band.layout.yaxis.tickformat == "~r"
    assert (
        metric_lines({"r": (STEPS, [1.0, 2, 3, 4, 5])}, mk.REWARD_MEAN).layout.yaxis.tickformat
        is None
    )
