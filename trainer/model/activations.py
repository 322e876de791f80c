"""The routed experts' gated activation: hidden = act(gate, up), one definition for the
training model and the rollout engine.

* ``swiglu`` (Shazeer 2020, arXiv 2002.05202): silu(gate) * up.
* ``clamped_swiglu`` (GPT-OSS, as transformers' ``GptOssExperts``): gate clamped above at
  ``limit``, up clamped to [-limit, limit], then (up + 1) * gate * sigmoid(alpha * gate).

Shapes: gate, up (..., H) -> (..., H), in their dtype.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def clamped_swiglu(gate: Tensor, up: Tensor, alpha: float, limit: float) -> Tensor:
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def gated_hidden(gate: Tensor, up: Tensor, spec: Any = None) -> Tensor:
    """``act(gate, up)`` for an ``ExpertFfnConfig``-like ``spec`` (None = swiglu)."""
    if spec is None or spec.activation == "swiglu":
        return F.silu(gate) * up
    return clamped_swiglu(gate, up, spec.alpha, spec.limit)
