"""Pure figure builders: plain data in, ``plotly.graph_objects.Figure`` out, one
module per figure family:

- ``lines``: time series (one metric of several runs; variants over seeds);
- ``heatmaps``: expert load per MoE layer;
- ``collapse``: collapse strip and survival curves of a stability review;
- ``empty``: the placeholder chart.

The stability table's rows (dashboard/charts/stability.py) are re-exported here, so
everything a page draws is importable from ``dashboard.charts.figures``.

No ORM and no request here: views fetch and downsample the data
(dashboard/charts/downsample.py), then call these. A series is ``(steps, values)``: two
equal-length sequences, values may hold None/NaN for gaps.
"""

from __future__ import annotations

from dashboard.charts.figures.collapse import SEED_SPREAD, Outcome, collapse_strip, survival_curves
from dashboard.charts.figures.empty import empty_figure
from dashboard.charts.figures.heatmaps import (
    SHARED_LOAD_SCALE,
    expert_heatmap,
    expert_heatmap_layers,
)
from dashboard.charts.figures.lines import CollapseMarker, metric_lines, seed_band
from dashboard.charts.stability import (
    STABILITY_COLUMNS,
    RunStats,
    StabilityRow,
    stability_table_rows,
)

__all__ = [
    "SEED_SPREAD",
    "SHARED_LOAD_SCALE",
    "STABILITY_COLUMNS",
    "CollapseMarker",
    "Outcome",
    "RunStats",
    "StabilityRow",
    "collapse_strip",
    "empty_figure",
    "expert_heatmap",
    "expert_heatmap_layers",
    "metric_lines",
    "seed_band",
    "stability_table_rows",
    "survival_curves",
]
