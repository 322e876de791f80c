import base64
import csv
import io
import json

import numpy as np
import pytest

from dashboard.charts.downsample import downsample
from dashboard.charts.export import (
    export_body,
    figure_data,
    figure_payload,
    figure_to_csv,
    figure_to_json,
)
from dashboard.charts.figures import collapse_strip, expert_heatmap, metric_lines
from trainer import metric_keys as mk


def test_csv_of_line_chart_is_long_format_with_empty_gaps():
    fig = metric_lines(
        {"r1": ([0, 1, 2], [0.5, None, 0.7]), "r2": ([0, 1, 2], [1.0, 2.0, 3.0])},
        mk.REWARD_MEAN,
        collapse_markers={"r2": (1, "non-finite loss")},
    )
    assert figure_to_csv(fig).splitlines() == [
        "trace,x,y",
        "r1,0,0.5",
        "r1,1,",
        "r1,2,0.7",
        "r2,0,1.0",
        "r2,1,2.0",
        "r2,2,3.0",
        "r2 collapse,1,2.0",
    ]


def test_json_export_has_titles_traces_and_nulls():
    fig = metric_lines({"r1": ([0, 1], [np.nan, 0.25])}, mk.POLICY_GRAD_NORM)
    data = json.loads(figure_to_json(fig))
    assert data["title"] == data["y_title"] == "gradient norm"
    assert data["x_title"] == "step"
    assert data["traces"] == [{"name": "r1", "type": "scatter", "x": [0, 1], "y": [None, 0.25]}]


def test_export_matches_the_downsampled_series_drawn():
    steps = np.arange(10_000)
    values = np.zeros(10_000)
    values[1234] = 9.0
    x, y = downsample(steps, values, 100)
    fig = metric_lines({"r": (x, y)}, mk.POLICY_GRAD_NORM)
    (trace,) = figure_data(fig)["traces"]
    assert trace["x"] == x.tolist() and trace["y"] == y.tolist()
    rows = list(csv.DictReader(io.StringIO(figure_to_csv(fig))))
    assert len(rows) == len(x) and {"trace": "r", "x": "1234", "y": "9.0"} in rows


def test_heatmap_csv_has_one_row_per_cell():
    fig = expert_heatmap([10, 20], [[0.75, 0.5], [0.25, 0.5]], layer=0)
    assert figure_to_csv(fig).splitlines() == [
        "trace,x,y,z",
        "layer 0,10,0,0.75",
        "layer 0,20,0,0.5",
        "layer 0,10,1,0.25",
        "layer 0,20,1,0.5",
    ]
    (trace,) = json.loads(figure_to_json(fig))["traces"]
    assert trace["z"] == [[0.75, 0.5], [0.25, 0.5]]


def test_collapse_strip_exports_variant_names_and_lower_bound_labels():
    fig = collapse_strip({"v": [(10, True), (100, False)]})
    assert figure_to_csv(fig).splitlines() == [
        "trace,x,y,text",
        "v: collapsed,v,10,",
        "v: censored,v,100,>= 100",
        "v: mean,v,55.0,>= 55",
    ]


def test_export_body_formats():
    fig = metric_lines({"r": ([0], [1.0])}, mk.REWARD_MEAN)
    body, content_type = export_body(fig, "csv")
    assert content_type.startswith("text/csv") and body.startswith("trace,x,y")
    body, content_type = export_body(fig, "json")
    assert content_type == "application/json" and json.loads(body)["traces"][0]["y"] == [1.0]
    with pytest.raises(ValueError, match="format"):
        export_body(fig, "xlsx")


def test_live_payload_carries_figure_and_running_flag():
    x = np.arange(4)
    y = np.array([0.1, np.nan, 0.3, 0.4])
    fig = metric_lines({"r": (x, y)}, mk.POLICY_GRAD_NORM)
    body = json.loads(figure_payload(fig, running=True, window=[0, 3]))
    assert body["running"] is True and body["window"] == [0, 3]
    assert body["figure"]["layout"]["uirevision"] == mk.POLICY_GRAD_NORM
    trace = body["figure"]["data"][0]
    # numpy arrays travel as plotly.js typed arrays (base64), NaN kept as a gap
    decoded = np.frombuffer(base64.b64decode(trace["y"]["bdata"]), dtype=trace["y"]["dtype"])
    np.testing.assert_array_equal(decoded, y)
