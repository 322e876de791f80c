"""The router's formulas, one definition for the training model and the rollout engine.

    logits   = x W_r^T (+ b_r) / T                          fp32
    scores   = softmax(logits)  or  sigmoid(logits)         the affinities gates come from
    choice   = logits + bias  (softmax)                     what the top-k ranks; the bias
             = sigmoid(logits) + bias  (sigmoid)            moves the choice, never a gate
    groups   (DeepSeek): experts in n_groups equal groups; a group's score is the sum of
             its two best choice scores (top2_sum, DeepSeek-V3 / GLM-4.5) or its best
             (max, DeepSeek-V2); a token keeps its topk_groups best groups and picks its
             top_k among their experts only
    gates    = scores[used] / sum(scores[used])  (norm_topk_prob; else scores[used])
             * routed_scaling_factor

The selection bias is the auxiliary-loss-free balancing bias (Wang et al. 2024,
arXiv 2408.15664; DeepSeek-V3, arXiv 2412.19437 sec. 2.1.2, ``e_score_correction_bias``):
added to the scores for the choice only, so a replayed or biased selection still
weights each chosen expert by the router's own affinity. Noise (noisy top-k gating, the
rollout engine's router-noise dose) is in logit units: it is added to the logits
before the sigmoid of a sigmoid router and to the biased logits of a softmax router,
and like the bias it moves the choice only.

transformers' DeepSeek-V3 and GLM-4.5 routers mask the dropped groups with -inf, its
DeepSeek-V2 router with 0 over positive softmax scores; both leave exactly the kept
groups' experts to the top-k (tests/trainer/test_routing.py).
Shapes: ``(N, E)`` scores per token, ``(N, k)`` indices.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# DeepSeek-V3's renormalisation guard (transformers adds it to the denominator).
_SIGMOID_NORM_EPS = 1e-20


def affinities(logits: Tensor, score: str) -> Tensor:
    """(N, E) fp32 scores the gates are taken from: softmax or sigmoid of the logits."""
    return logits.softmax(dim=-1) if score == "softmax" else logits.sigmoid()


def distribution(scores: Tensor, score: str) -> Tensor:
    """The router's distribution over experts (sums to 1): the softmax itself, or the
    sigmoid affinities normalised (DeepSeek-V3's s_i / sum_j s_j, eq. 17). Balance
    losses, router entropy and the router anchor read it."""
    if score == "softmax":
        return scores
    return scores / scores.sum(dim=-1, keepdim=True).clamp_min(1e-20)


def choice_scores(
    logits: Tensor,
    bias: Tensor | None,
    score: str,
    perturb: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """The scores the top-k selection ranks (module docstring); ``bias (E,)`` or None,
    ``perturb`` adds noise in logit units (None = none)."""
    if score == "softmax":
        choice = logits if bias is None else logits + bias
        return choice if perturb is None else perturb(choice)
    noisy = logits if perturb is None else perturb(logits)
    choice = noisy.sigmoid()
    return choice if bias is None else choice + bias


def select_experts(
    choice: Tensor,
    top_k: int,
    n_groups: int = 1,
    topk_groups: int = 1,
    group_score: str = "top2_sum",
) -> Tensor:
    """(N, k) expert ids: the top_k of ``choice (N, E)``, limited to each token's
    ``topk_groups`` best of ``n_groups`` groups when grouped (module docstring)."""
    if n_groups <= 1 or topk_groups >= n_groups:
        return choice.topk(top_k, dim=-1).indices
    n, e = choice.shape
    grouped = choice.view(n, n_groups, e // n_groups)
    if group_score == "top2_sum":
        group = grouped.topk(2, dim=-1).values.sum(dim=-1)
    else:
        group = grouped.max(dim=-1).values
    best = group.topk(topk_groups, dim=-1).indices  # (N, topk_groups)
    keep = torch.zeros_like(group, dtype=torch.bool).scatter_(1, best, True)
    kept = keep[:, :, None].expand(n, n_groups, e // n_groups).reshape(n, e)
    return choice.masked_fill(~kept, float("-inf")).topk(top_k, dim=-1).indices


def topk_gates(probs: Tensor, indices: Tensor, normalize: bool = True) -> Tensor:
    """Gate weights: probs gathered at ``indices``, renormalised to sum 1 when
    ``normalize`` (norm_topk_prob), else the raw full-softmax probabilities.

    probs: (..., E) full softmax; indices: (..., k). Returns (..., k).
    """
    picked = probs.gather(-1, indices)
    if not normalize:
        return picked
    return picked / picked.sum(-1, keepdim=True)


def gate_weights(
    scores: Tensor, indices: Tensor, normalize: bool, score: str = "softmax", scaling: float = 1.0
) -> Tensor:
    """(..., k) gates of the used experts ``indices`` from the affinities ``scores``
    (module docstring): renormalised when ``normalize``, times ``scaling``."""
    if score == "softmax":
        gates = topk_gates(scores, indices, normalize)
    else:
        gates = scores.gather(-1, indices)
        if normalize:
            gates = gates / (gates.sum(-1, keepdim=True) + _SIGMOID_NORM_EPS)
    return gates if scaling == 1.0 else gates * scaling
