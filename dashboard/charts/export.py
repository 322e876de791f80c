"""Chart data as CSV and JSON: exactly the series a figure draws.

Reading the data back out of the built figure (rather than from the database
again) guarantees that the download matches the chart, downsampling included.

CSV is long ("tidy") format, one row per drawn point:
``trace,x,y`` for line and marker charts, plus ``z`` when the figure has a
heatmap (x = step, y = expert, z = load) and ``text`` when a trace carries
labels (such as ">= N"). Missing values are empty cells.

JSON keeps each trace's arrays: ``{"title", "x_title", "y_title", "traces":
[{"name", "type", "x", "y"[, "z"][, "text"]}]}`` with null for missing values.

A trace may set ``meta["export_x"]`` to the x values to export in place of the
drawn ones (the collapse strip draws seeds at jittered numeric positions but
exports the variant name), ``meta["export_text"]`` to the labels to export in
place of the drawn ones (it draws one ">= N" per group of seeds censored at
the same step, but exports each seed's), and ``meta["export"] = False`` to
leave out a trace that only places a label.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.utils import PlotlyJSONEncoder

from dashboard.charts.layout import fit_layout


def _plain(value: Any) -> Any:
    """A JSON/CSV-friendly scalar: numpy -> Python, NaN/inf -> None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _column(values: Any) -> list[Any]:
    if values is None:
        return []
    if isinstance(values, str):
        return [values]
    return [_plain(v) for v in np.asarray(values, dtype=object).tolist()]


def _text(obj: Any) -> str | None:
    return obj.text if obj is not None and obj.text else None


def _trace_record(trace: Any) -> dict[str, Any]:
    meta = trace.meta if isinstance(trace.meta, dict) else {}
    record: dict[str, Any] = {
        "name": trace.name or "",
        "type": trace.type,
        "x": _column(meta.get("export_x", trace.x)),
        "y": _column(meta.get("export_y", trace.y)),
    }
    if trace.type == "heatmap":
        record["z"] = [_column(row) for row in np.asarray(trace.z, dtype=np.float64)]
    text = meta.get("export_text", getattr(trace, "text", None))
    if text is not None and not isinstance(text, str):
        record["text"] = _column(text)
    return record


def figure_data(fig: go.Figure) -> dict[str, Any]:
    """The drawn series of ``fig`` as plain Python (see module docstring)."""
    layout = fig.layout
    return {
        "title": _text(layout.title) or "",
        "x_title": _text(layout.xaxis.title) or "",
        "y_title": _text(layout.yaxis.title) or "",
        "traces": [
            _trace_record(t)
            for t in fig.data
            if not (isinstance(t.meta, dict) and t.meta.get("export") is False)
        ],
    }


def figure_to_json(fig: go.Figure) -> str:
    return json.dumps(figure_data(fig), allow_nan=False)


def _rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    name = record["name"]
    if record["type"] == "heatmap":
        return [
            {"trace": name, "x": x, "y": y, "z": record["z"][i][j]}
            for i, y in enumerate(record["y"])
            for j, x in enumerate(record["x"])
        ]
    texts = record.get("text") or [None] * len(record["x"])
    return [
        {"trace": name, "x": x, "y": y, "text": t}
        for x, y, t in zip(record["x"], record["y"], texts, strict=False)
    ]


def figure_to_csv(fig: go.Figure) -> str:
    """Long-format CSV of the drawn points (see module docstring)."""
    data = figure_data(fig)
    rows = [row for record in data["traces"] for row in _rows(record)]
    columns = ["trace", "x", "y"]
    if any(r["type"] == "heatmap" for r in data["traces"]):
        columns.append("z")
    if any(row.get("text") is not None for row in rows):
        columns.append("text")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row.get(c) is None else row[c] for c in columns})
    return out.getvalue()


def figure_payload(fig: go.Figure, *, running: bool = False, **extra: Any) -> str:
    """JSON body for the live-update endpoint read by static/dashboard/live.js:
    ``{"figure": {"data", "layout"}, "running": bool, ...extra}``.

    Uses plotly's encoder, which writes numpy arrays as compact typed arrays.
    """
    return encode_payload(figure_dict(fig, running=running, **extra))


def figure_dict(fig: go.Figure, *, running: bool = False, **extra: Any) -> dict[str, Any]:
    """``figure_payload`` before encoding, to put several charts in one body; the
    figure laid out by the one rule every chart follows (``dashboard.charts.layout``)."""
    return {"figure": fit_layout(fig).to_plotly_json(), "running": running, **extra}


def encode_payload(body: Any) -> str:
    """JSON with plotly's encoder (numpy arrays as compact base64 typed arrays)."""
    return json.dumps(body, cls=PlotlyJSONEncoder, separators=(",", ":"))


EXPORT_FORMATS: dict[str, str] = {
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
}


def export_body(fig: go.Figure, fmt: str) -> tuple[str, str]:
    """(body, content type) of a chart download: ``fmt`` is "csv" or "json"."""
    if fmt == "csv":
        return figure_to_csv(fig), EXPORT_FORMATS["csv"]
    if fmt == "json":
        return figure_to_json(fig), EXPORT_FORMATS["json"]
    raise ValueError(f"format must be one of {sorted(EXPORT_FORMATS)}, got {fmt!r}")


def records_to_csv(records: list[dict[str, Any]]) -> str:
    """Rows of a table (e.g. ``StabilityRow.as_dict()``) as CSV; None is an empty cell."""
    columns = list(records[0]) if records else []
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({c: "" if record.get(c) is None else _plain(record[c]) for c in columns})
    return out.getvalue()
