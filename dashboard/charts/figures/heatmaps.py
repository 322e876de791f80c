"""Expert-load heatmaps: experts (rows) x steps (columns) of one MoE layer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from dashboard.charts.style import base_layout, step_axis

# Expert-load heatmaps compared side by side: colors span 0 to this many times the
# balanced load (a 4x-overloaded expert and worse saturate).
SHARED_LOAD_SCALE = 4.0


def expert_heatmap(
    steps: Sequence[int] | np.ndarray,
    load_matrix: Sequence[Sequence[float]] | np.ndarray,
    layer: int,
    *,
    title: str | None = None,
    uirevision: str | None = None,
    shared_scale: bool = False,
) -> go.Figure:
    """Expert load of one MoE layer: experts (rows) x steps (columns).

    load_matrix: (E, n) share of routed assignments per expert and step
    (experts/load/L{layer}); balanced load is 1/E in every cell.
    ``shared_scale``: colors span 0 to ``SHARED_LOAD_SCALE`` x balanced load
    (capped at 100%) instead of this run's own maximum, so heatmaps of
    different runs side by side read alike (a run within +-40% of balance must
    not look as skewed as one with an expert at 60%); hover shows the value.
    """
    fig = go.Figure(
        layout=base_layout(
            title=title or f"Expert load, layer {layer}",
            x_title="step",
            y_title="expert",
            uirevision=uirevision or f"experts/load/L{layer}",
            hovermode="closest",
        )
    )
    fig.add_trace(_heatmap_trace(steps, load_matrix, layer, shared_scale=shared_scale))
    fig.update_xaxes(**step_axis([np.asarray(steps)]))
    return fig


def _heatmap_trace(
    steps: Sequence[int] | np.ndarray,
    load_matrix: Sequence[Sequence[float]] | np.ndarray,
    layer: int,
    *,
    shared_scale: bool = False,
) -> go.Heatmap:
    z = np.asarray(load_matrix, dtype=np.float64)
    x = np.asarray(steps)
    if z.ndim != 2 or z.shape[1] != x.size:
        raise ValueError(f"load_matrix must be (experts, {x.size}), got {z.shape}")
    n_experts = z.shape[0]
    balanced = 1 / n_experts
    zmax = min(1.0, SHARED_LOAD_SCALE * balanced) if shared_scale else None
    return go.Heatmap(
        x=x,
        y=np.arange(n_experts),
        z=z,
        zmin=0.0,
        zmax=zmax,
        colorscale="Viridis",
        colorbar={"title": {"text": f"load (balanced = {balanced:.1%})"}, "tickformat": ".0%"},
        name=f"layer {layer}",
        hovertemplate="step %{x}<br>expert %{y}<br>load %{z:.1%}<extra></extra>",
        meta={"layer": layer, "role": "expert_load"},
    )


def expert_heatmap_layers(
    by_layer: Mapping[int, tuple[Sequence[int] | np.ndarray, np.ndarray]],
    *,
    uirevision: str = "experts/load",
) -> go.Figure:
    """One heatmap per MoE layer with a layer picker (a dropdown); the first layer shows."""
    layers = list(by_layer)
    if not layers:
        raise ValueError("no layers to draw")
    fig = go.Figure(
        layout=base_layout(
            title=f"Expert load, layer {layers[0]}",
            x_title="step",
            y_title="expert",
            uirevision=uirevision,
            hovermode="closest",
        )
    )
    for i, layer in enumerate(layers):
        steps, matrix = by_layer[layer]
        trace = _heatmap_trace(steps, matrix, layer)
        trace.visible = i == 0
        fig.add_trace(trace)
    buttons = [
        {
            "label": f"layer {layer}",
            "method": "update",
            "args": [
                {"visible": [j == i for j in range(len(layers))]},
                {"title.text": f"Expert load, layer {layer}"},
            ],
        }
        for i, layer in enumerate(layers)
    ]
    fig.update_layout(
        updatemenus=[
            {"buttons": buttons, "direction": "down", "x": 1.0, "xanchor": "right", "y": 1.12}
        ]
    )
    return fig
