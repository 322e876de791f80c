"""Gradient surgery between the policy gradient and the routing-loss gradient.

PCGrad (Yu et al. 2020, arXiv 2001.06782) applied to two objectives on the
parameters they share: when the routing-loss gradient g_r (aux + z + router
KL) conflicts with the policy gradient g_p (cos < 0), its component along
g_p is removed:

    g_r <- g_r - (g_r . g_p) / ||g_p||^2 * g_p

The division is by the SQUARED norm; that makes the result orthogonal to g_p
(dividing by ||g_p|| alone does not project). Only g_r is changed: the policy
gradient is the objective, the balancing losses are the regularisers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def project_conflicting(g_r: Tensor, g_p: Tensor, eps: float = 1e-12) -> tuple[Tensor, float, bool]:
    """Project ``g_r`` off ``g_p`` when they conflict.

    ``g_r, g_p``: same shape (any; treated as flat vectors), fp32 arithmetic.
    Returns ``(g_r_new, cos, projected)``: ``cos`` = cos(g_p, g_r) (0 when
    either vector has zero norm), ``projected`` True when cos < 0 and the
    projection was applied; otherwise ``g_r`` is returned unchanged.
    """
    r = g_r.float().reshape(-1)
    p = g_p.float().reshape(-1)
    dot = torch.dot(r, p)
    p_sq = torch.dot(p, p)
    r_norm = torch.linalg.vector_norm(r)
    denom = r_norm * p_sq.sqrt()
    cos = float(dot / denom) if float(denom) > eps else 0.0
    if cos >= 0.0:
        return g_r, cos, False
    projected = r - (dot / p_sq) * p
    return projected.reshape(g_r.shape).to(g_r.dtype), cos, True


def project_conflicting_lists(
    g_r: Sequence[Tensor], g_p: Sequence[Tensor], eps: float = 1e-12
) -> tuple[list[Tensor], float, bool]:
    """``project_conflicting`` on per-parameter gradient lists (one shared flat vector).

    ``g_r[i]`` and ``g_p[i]`` belong to the same parameter. The cosine and the
    projection use the concatenation of all of them, as PCGrad does for a
    shared parameter set. Returns the projected list in the same shapes.
    """
    flat_r = torch.cat([g.float().reshape(-1) for g in g_r])
    flat_p = torch.cat([g.float().reshape(-1) for g in g_p])
    new, cos, projected = project_conflicting(flat_r, flat_p, eps)
    if not projected:
        return list(g_r), cos, False
    out, offset = [], 0
    for g in g_r:
        out.append(new[offset : offset + g.numel()].reshape(g.shape).to(g.dtype))
        offset += g.numel()
    return out, cos, True
