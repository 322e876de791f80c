"""Colours, titles and the shared layout of every dashboard chart.

Colours: one palette whose every colour has at least 3:1 contrast against the
white plot background (WCAG 2.1 success criterion 1.4.11, non-text contrast),
so thin lines stay readable; a page assigns colours to its runs or variants
once (``assign_colors``) and passes the map to every figure, so a run keeps its
colour across charts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from trainer import metric_keys as mk

PALETTE: tuple[str, ...] = (
    "#1f5fa8",  # blue
    "#c0392b",  # red
    "#1e7d45",  # green
    "#7d3c98",  # purple
    "#b35309",  # dark orange
    "#0f7282",  # teal
    "#8c564b",  # brown
    "#c2185b",  # magenta
    "#4d5d6e",  # slate
    "#6b6b00",  # olive
    "#2e4053",  # navy
    "#a04000",  # rust
)
BASELINE_COLOR = "#111111"
TEXT_COLOR = "#1a1a1a"
GRID_COLOR = "#e3e3e3"
BAND_OPACITY = 0.18

# A small template of our own instead of plotly's default: readable dark-on-light
# and a few hundred bytes in each JSON payload instead of the default's ~8 kB.
LAB_TEMPLATE = go.layout.Template(
    layout={
        "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "color": TEXT_COLOR},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "colorway": list(PALETTE),
        "xaxis": {"gridcolor": GRID_COLOR, "zerolinecolor": "#c8c8c8", "linecolor": "#9a9a9a"},
        "yaxis": {"gridcolor": GRID_COLOR, "zerolinecolor": "#c8c8c8", "linecolor": "#9a9a9a"},
        "hoverlabel": {"font": {"color": TEXT_COLOR}, "bgcolor": "#ffffff"},
        "legend": {"bgcolor": "rgba(255,255,255,0.8)"},
    }
)

# Human titles for the chart axes; keys not listed fall back to the key itself.
METRIC_TITLES: dict[str, str] = {
    mk.REWARD_MEAN: "mean reward",
    mk.REWARD_ACCURACY: "accuracy (train batch)",
    mk.EVAL_ACCURACY: "accuracy (held-out)",
    mk.RESPONSE_LENGTH_MEAN: "mean response length",
    mk.MISMATCH_KL_K1: "training-inference KL (k1)",
    mk.MISMATCH_KL_K3: "training-inference KL (k3)",
    mk.MISMATCH_KL_K3_MAX: "largest per-sequence KL (k3)",
    mk.MISMATCH_EXTREME_TOKEN_FRAC: "extreme-token share",
    mk.MISMATCH_ROUTING_INCONSISTENCY: "routing inconsistency",
    mk.MISMATCH_TOKEN_ANY_LAYER_FRAC: "tokens routed differently in any layer",
    mk.MISMATCH_SDI: "sequence disagreement index",
    mk.EXPERTS_UTILIZATION: "expert utilization",
    mk.EXPERTS_MAX_VIOLATION: "MaxVio",
    mk.EXPERTS_ROUTER_ENTROPY: "router entropy",
    mk.ROUTER_TEMPERATURE: "router temperature",
    mk.POLICY_GRAD_NORM: "gradient norm",
    mk.GRADS_COS_POLICY_AUX: "cos(policy grad, aux grad)",
    mk.GRADS_SURGERY_FRAC: "gradient-surgery share",
    mk.POLICY_CLIP_FRAC: "PPO clip share",
    mk.TIS_CLIP_FRAC: "TIS clip share",
}

# Keys that are shares in [0, 1]: their axes show percentages.
SHARE_KEYS: frozenset[str] = frozenset(
    {
        mk.REWARD_ACCURACY,
        mk.EVAL_ACCURACY,
        mk.MISMATCH_EXTREME_TOKEN_FRAC,
        mk.MISMATCH_ROUTING_INCONSISTENCY,
        mk.MISMATCH_TOKEN_ANY_LAYER_FRAC,
        mk.MISMATCH_SDI,
        mk.MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY,
        mk.GRADS_SURGERY_FRAC,
        mk.POLICY_CLIP_FRAC,
        mk.TIS_CLIP_FRAC,
        mk.TIS_MASKED_FRAC,
        mk.R3_REPLAYED_FRAC,
    }
)


def metric_title(key: str) -> str:
    if key.startswith(mk.EXPERTS_LOAD_PREFIX):
        return f"expert load, layer {key.removeprefix(mk.EXPERTS_LOAD_PREFIX)}"
    return METRIC_TITLES.get(key, key)


def stable_color(label: str) -> str:
    """A palette colour chosen by hashing the label: the same label, the same colour."""
    digest = hashlib.sha1(label.encode("utf-8")).digest()
    return PALETTE[digest[0] % len(PALETTE)]


def assign_colors(
    labels: Iterable[str], existing: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Palette colours in order of first appearance (distinct for up to len(PALETTE) labels).

    Labels already in ``existing`` keep their colour; the rest take the next
    colours not yet used.
    """
    colors = dict(existing or {})
    used = set(colors.values())
    free = [c for c in PALETTE if c not in used]
    for label in labels:
        if label in colors:
            continue
        colors[label] = free.pop(0) if free else stable_color(label)
    return colors


def color_of(label: str, colors: Mapping[str, str] | None) -> str:
    if colors and label in colors:
        return colors[label]
    return stable_color(label)


def rgba(hex_color: str, alpha: float) -> str:
    """'#rrggbb' -> 'rgba(r,g,b,alpha)' for translucent bands."""
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


# Step spans up to this long get one tick per step (steps are whole numbers).
SHORT_STEP_SPAN = 10


def step_axis(steps: Sequence[np.ndarray]) -> dict:
    """x-axis settings for ``steps`` (the drawn step arrays): a whole-number tick per
    step when the span is short, where Plotly would otherwise label 0.5, 1.5, ...
    (a new poll recomputes this as a run grows)."""
    drawn = [s for s in steps if len(s)]
    if not drawn:
        return {}
    span = max(float(np.max(s)) for s in drawn) - min(float(np.min(s)) for s in drawn)
    return {"dtick": 1, "tick0": 0} if span <= SHORT_STEP_SPAN else {}


def base_layout(
    *, title: str, x_title: str, y_title: str, uirevision: str, hovermode: str | bool = "x unified"
) -> dict:
    """Layout shared by the line charts. ``uirevision`` is constant per chart so that
    Plotly.react with new data keeps the user's zoom and legend choices."""
    return {
        "template": LAB_TEMPLATE,
        "title": {"text": title, "x": 0.01, "xanchor": "left"},
        "xaxis": {"title": {"text": x_title}},
        "yaxis": {"title": {"text": y_title}},
        "hovermode": hovermode,
        "uirevision": uirevision,
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0, "xanchor": "left"},
        "margin": {"l": 60, "r": 20, "t": 70, "b": 50},
    }
