"""Router load-balancing terms for MoE layers.

* Switch-Transformer auxiliary loss (Fedus et al. 2021): ``E * sum_i f_i P_i``.
* ST-MoE router z-loss (Zoph et al. 2022): ``mean(logsumexp(logits)^2)``.
* DeepSeek-V3 auxiliary-loss-free balancing: a selection-only per-expert bias
  nudged each step towards uniform load.

Coefficients (alpha, beta) are applied by the caller. Shapes: one layer's
flattened tokens, ``probs/logits (N, E)``, ``indices (N, k)``, ``mask (N,)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

# All-reduce SUM across ranks (``DistContext.sum``); None = this process only.
SumRanks = Callable[[Tensor], Tensor]


def _rank_share_denominator(local: Tensor, sum_ranks: SumRanks | None, world_size: int) -> Tensor:
    """What a rank divides its local SUM by so that the ranks' results, summed and
    divided by ``world_size`` (gradient averaging), give sum / global count:
    ``global_count / world_size``; the local count itself single-process."""
    if sum_ranks is None:
        return local
    return sum_ranks(local.detach()).to(local.dtype).to(local.device) / world_size


def _assignment_counts(
    indices: Tensor, weights: Tensor, rows: Tensor, n_rows: int, n_experts: int
) -> Tensor:
    """(n_rows, E) count of routed assignments; ``rows (N,)`` says which row each token adds to."""
    n, k = indices.shape
    flat = rows.long()[:, None] * n_experts + indices.long()  # (N, k)
    counts = torch.zeros(n_rows * n_experts, dtype=torch.float32, device=indices.device)
    counts.scatter_add_(0, flat.reshape(-1), weights[:, None].expand(n, k).reshape(-1))
    return counts.view(n_rows, n_experts)


def switch_aux_loss(
    probs: Tensor,
    indices: Tensor,
    n_experts: int,
    mask: Tensor | None = None,
    scope: Literal["global", "sequence"] = "global",
    seq_ids: Tensor | None = None,
    sum_ranks: SumRanks | None = None,
    world_size: int = 1,
) -> Tensor:
    """Switch load-balancing loss ``E * sum_i f_i * P_i`` (alpha applied by the caller).

    ``probs (N, E)``: router softmax per token (carries the gradient);
    ``indices (N, k)``: the top-k experts per token; ``mask (N,)``: tokens that
    count (None = all). f_i = share of the routed assignments (N * k slots) that
    went to expert i (no gradient); P_i = mean router probability of expert i.
    The value is 1 for perfectly uniform routing and probabilities.

    ``scope="global"``: f and P over all masked tokens. ``scope="sequence"``:
    f and P per sequence (``seq_ids (N,)`` gives each token's sequence, any
    integers), the loss per sequence, then the mean over sequences that have
    masked tokens.

    Over several ranks (``sum_ranks``, ``world_size``): f is the share of ALL
    ranks' assignments and P_i the sum of this rank's probabilities over the
    global token count, times ``world_size``, so the ranks' values averaged (as
    gradients are) equal the loss of the single-process global batch; sequences
    never span ranks, so the sequence scope only needs the global sequence count.
    """
    probs = probs.float()
    n = probs.shape[0]
    weights = (
        torch.ones(n, device=probs.device) if mask is None else mask.to(torch.float32).reshape(n)
    )
    if scope == "global":
        rows, n_rows = torch.zeros(n, dtype=torch.long, device=probs.device), 1
    elif scope == "sequence":
        if seq_ids is None:
            raise ValueError("scope='sequence' needs seq_ids (each token's sequence)")
        _, rows = torch.unique(seq_ids.reshape(n), return_inverse=True)
        n_rows = int(rows.max().item()) + 1 if n else 0
    else:
        raise ValueError(f"aux-loss scope must be global or sequence, not {scope!r}")

    counts = _assignment_counts(indices, weights, rows, n_rows, n_experts)  # (S, E)
    prob_sum = torch.zeros(n_rows, n_experts, device=probs.device).index_add(
        0, rows, probs * weights[:, None]
    )
    tokens = torch.zeros(n_rows, device=probs.device).index_add(0, rows, weights)
    if scope == "global" and sum_ranks is not None:
        counts = sum_ranks(counts).to(torch.float32).to(probs.device)
        tokens = _rank_share_denominator(tokens, sum_ranks, world_size)
    f = counts / counts.sum(dim=1, keepdim=True).clamp_min(1.0)
    p_mean = prob_sum / tokens.clamp_min(1.0 if sum_ranks is None else 1e-12)[:, None]
    per_row = n_experts * (f * p_mean).sum(dim=1)  # (S,)
    has_tokens = (tokens > 0).float()
    if scope == "global":
        return (per_row * has_tokens).sum() / has_tokens.sum().clamp_min(1.0)
    n_seq = _rank_share_denominator(has_tokens.sum(), sum_ranks, world_size)
    return (per_row * has_tokens).sum() / n_seq.clamp_min(1.0 if sum_ranks is None else 1e-12)


def router_z_loss(
    logits: Tensor,
    mask: Tensor | None = None,
    sum_ranks: SumRanks | None = None,
    world_size: int = 1,
) -> Tensor:
    """ST-MoE router z-loss: mean over (masked) tokens of ``logsumexp(logits)^2``.

    ``logits (N, E)`` fp32 router logits; ``mask (N,)`` or None. Penalises
    large router logits, which overflow in low precision. Over several ranks the
    mean is over every rank's tokens (see ``switch_aux_loss``).
    """
    z = torch.logsumexp(logits.float(), dim=-1) ** 2
    if mask is None:
        if sum_ranks is None:
            return z.mean()
        mask = torch.ones_like(z)
    m = mask.to(torch.float32).reshape(z.shape)
    n = _rank_share_denominator(m.sum(), sum_ranks, world_size)
    return (torch.where(m != 0, z, 0.0) * m).sum() / n.clamp_min(
        1.0 if sum_ranks is None else 1e-12
    )


def aux_free_bias_update(bias: Tensor, load: Tensor, rate: float) -> Tensor:
    """DeepSeek-V3 auxiliary-loss-free balancing step (arXiv 2412.19437, sec. 2.1.2).

    ``bias (E,)`` is added to the router scores for top-k SELECTION only (gate
    weights use the unbiased scores). ``load (E,)``: the step's assignments per
    expert (counts or shares). Overloaded experts (load above the mean) lose
    ``rate``, underloaded ones gain it: ``bias + rate * sign(mean(load) - load)``.
    Returns a new tensor.
    """
    load = load.float()
    return bias + rate * torch.sign(load.mean() - load).to(bias.dtype)
