"""The placeholder chart: a blank figure with a centred message."""

from __future__ import annotations

import plotly.graph_objects as go

from dashboard.charts.style import LAB_TEMPLATE


def empty_figure(message: str) -> go.Figure:
    """A blank chart with a centred message (no runs selected, no data yet).

    ``layout.meta.placeholder`` carries the message: the page (live.js) shows it
    as a plain card instead of drawing an empty frame; downloads keep the figure."""
    fig = go.Figure(layout={"template": LAB_TEMPLATE, "meta": {"placeholder": message}})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.add_annotation(
        text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font={"size": 14}
    )
    return fig
