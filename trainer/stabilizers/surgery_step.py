"""Gradient surgery in one training step (config ``stabilizers.surgery.enabled``, ``.scope``).

Replaces ``(policy_loss + routing_loss).backward()``: the two gradients are taken
separately, the routing-loss gradient g_r (aux + z + router KL, coefficients already
applied) is projected off the policy gradient g_p on the scope parameters when they
conflict (``trainer.algorithms.surgery.project_conflicting_lists``, PCGrad), and
each parameter's ``.grad`` receives ``g_p + g_r``: projected inside the scope, plain
outside it. The cost is a second backward pass through the shared graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from trainer import metric_keys as mk
from trainer.algorithms.surgery import project_conflicting_lists


@dataclass(frozen=True)
class SurgeryStats:
    """cos(g_p, g_r) on the scope (0 when either is zero) and whether g_r was projected."""

    cos: float
    projected: bool


def _grads(
    loss: Tensor, params: Sequence[nn.Parameter], retain_graph: bool
) -> tuple[list[Tensor], list[bool]]:
    """``(d loss / d p, reached)`` per p: zeros and False where ``loss`` does not reach p."""
    if not isinstance(loss, Tensor) or not loss.requires_grad:
        return [torch.zeros_like(p) for p in params], [False] * len(params)
    grads = torch.autograd.grad(loss, params, retain_graph=retain_graph, allow_unused=True)
    reached = [g is not None for g in grads]
    return [
        torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)
    ], reached


def surgery_backward(
    params: Sequence[nn.Parameter],
    policy_loss: Tensor,
    routing_loss: Tensor,
    scope_params: Sequence[nn.Parameter],
) -> SurgeryStats:
    """Backward of ``policy_loss + routing_loss`` with PCGrad on ``scope_params``.

    ``params``: every trainable parameter (``scope_params`` must be among them);
    ``scope_params``: the router weights (scope "router") or ``params`` (scope
    "all"). The results are ADDED to ``.grad`` as ``backward()`` would (zero the
    gradients first unless accumulating); a parameter neither loss reaches keeps its
    ``.grad`` (None stays None). A ``routing_loss`` without a graph (no routing
    terms on) gives g_r = 0, cos 0 and no projection.
    """
    params = list(params)
    scope_ids = {id(p) for p in scope_params}
    missing = scope_ids - {id(p) for p in params}
    if missing:
        raise ValueError(f"{len(missing)} scope parameters are not in params")
    g_p, reached_p = _grads(policy_loss, params, retain_graph=True)
    g_r, reached_r = _grads(routing_loss, params, retain_graph=False)

    in_scope = [i for i, p in enumerate(params) if id(p) in scope_ids]
    if in_scope:
        new_r, cos, projected = project_conflicting_lists(
            [g_r[i] for i in in_scope], [g_p[i] for i in in_scope]
        )
        for i, g in zip(in_scope, new_r, strict=True):
            g_r[i] = g
    else:
        cos, projected = 0.0, False

    for p, gp, gr, hit_p, hit_r in zip(params, g_p, g_r, reached_p, reached_r, strict=True):
        if not (hit_p or hit_r):
            continue
        total = (gp + gr).detach()
        if p.grad is None:
            p.grad = total
        else:
            p.grad.add_(total)
    return SurgeryStats(cos=cos, projected=projected)


def surgery_metrics(stats: Sequence[SurgeryStats]) -> dict[str, float]:
    """Means over a step's minibatches: ``grads/cos_policy_aux`` and ``grads/surgery_frac``."""
    if not stats:
        return {}
    n = len(stats)
    return {
        mk.GRADS_COS_POLICY_AUX: sum(s.cos for s in stats) / n,
        mk.GRADS_SURGERY_FRAC: sum(s.projected for s in stats) / n,
    }
