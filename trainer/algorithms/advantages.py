"""Advantage estimators: GRPO group normalisation, EMA reward normalisation,
expert-level z-scores, and GAE for PPO.

Shapes: per-sequence quantities are ``(N,)``; per-token ones follow the batch
layout of docs/trainer-internals.md, ``(B, T)`` with a bool mask that is True
on response tokens. All arithmetic is fp32 and vectorised.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

# A group whose rewards (or advantages) spread less than this, relative to their
# size, counts as all-equal: its advantages are exactly 0. Without it, fp32
# rounding of the mean leaves ~1e-8 residues that a ~1e-8 std divides up to
# O(0.1) advantages (a group of 0.7s got +0.056 each).
EQUAL_SPREAD_RTOL = 1e-6


def _flat(std: Tensor, mean: Tensor) -> Tensor:
    """True where a group's spread is numerically zero (see EQUAL_SPREAD_RTOL)."""
    return std <= EQUAL_SPREAD_RTOL * (1.0 + mean.abs())


# --------------------------------------------------------------------------- GRPO
def grpo_advantages(
    rewards: Tensor, group_size: int, std_normalize: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages (GRPO, DeepSeekMath arXiv 2402.03300).

    ``rewards (N,)`` holds consecutive groups of ``group_size`` responses to the
    same prompt: ``[g0 x group_size, g1 x group_size, ...]``. Each reward minus
    its group mean, divided by ``group std + eps`` when ``std_normalize``. The
    std is the population std (ddof 0), so a group's advantages have unit
    variance; a group with equal rewards gets exactly zero advantages (the
    statistics are taken in float64 and a spread below ``EQUAL_SPREAD_RTOL``
    counts as none). Returns ``(N,)`` fp32.
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.double().view(-1, group_size)
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, correction=0, keepdim=True)
    centred = torch.where(_flat(std, mean), 0.0, r - mean)
    if std_normalize:
        centred = centred / (std + eps)
    return centred.reshape(-1).float()


class RewardNormalizer:
    """EMA-smoothed reward normalisation: ``(r - mean_ema) / (std_ema + eps)``.

    Keeps exponential moving averages of the first and second moments of the
    reward, ``m <- d*m + (1-d)*mean(r)`` and ``q <- d*q + (1-d)*mean(r^2)``,
    so ``var = q - m^2`` (clamped at 0). The first ``update`` initialises both
    moments from its batch (no bias towards 0). Before any update,
    ``normalize`` only subtracts 0 and divides by 1 + eps, i.e. is (almost) the
    identity. Call ``update`` with the step's rewards, then ``normalize``.
    """

    def __init__(self, decay: float = 0.99, eps: float = 1e-6):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.eps = eps
        self.mean = 0.0
        self.sq_mean = 1.0
        self.count = 0

    @property
    def std(self) -> float:
        return max(self.sq_mean - self.mean**2, 0.0) ** 0.5 if self.count else 1.0

    def update(self, rewards: Tensor) -> None:
        r = rewards.detach().double()
        batch_mean, batch_sq = r.mean().item(), (r * r).mean().item()
        if self.count == 0:
            self.mean, self.sq_mean = batch_mean, batch_sq
        else:
            d = self.decay
            self.mean = d * self.mean + (1.0 - d) * batch_mean
            self.sq_mean = d * self.sq_mean + (1.0 - d) * batch_sq
        self.count += 1

    def normalize(self, rewards: Tensor) -> Tensor:
        mean = self.mean if self.count else 0.0
        return (rewards.float() - mean) / (self.std + self.eps)

    def state_dict(self) -> dict[str, Any]:
        return {
            "decay": self.decay,
            "eps": self.eps,
            "mean": self.mean,
            "sq_mean": self.sq_mean,
            "count": self.count,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay = float(state["decay"])
        self.eps = float(state["eps"])
        self.mean = float(state["mean"])
        self.sq_mean = float(state["sq_mean"])
        self.count = int(state["count"])


# --------------------------------------------------------------------------- expert z-scores
def dominant_expert(indices: Tensor, mask: Tensor, n_experts: int) -> Tensor:
    """Each sequence's dominant expert in one MoE layer.

    ``indices (N, T, k)``: the layer's top-k expert ids per token;
    ``mask (N, T)``: the tokens that count (e.g. the response). For sequence n,
    count how often each expert appears in ANY of the k slots over its masked
    tokens; the dominant expert is the most frequent one, ties broken towards
    the lowest expert id. A sequence with no masked tokens gets expert 0.
    Returns ``LongTensor (N,)``.
    """
    n, t, k = indices.shape
    weights = mask.to(torch.float32)[:, :, None].expand(n, t, k).reshape(n, t * k)
    counts = torch.zeros(n, n_experts, dtype=torch.float32, device=indices.device)
    counts.scatter_add_(1, indices.long().reshape(n, t * k), weights)
    # argmax returns the first maximal index, i.e. the lowest expert id on ties.
    return counts.argmax(dim=1)


def expert_zscore_advantages(adv: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """Z-score advantages within groups of sequences: ``(adv - mean_g) / (std_g + eps)``.

    ``adv (N,)``; ``group_ids LongTensor (N,)`` (any integers, not necessarily
    contiguous). The grouping used by the trainer is
    ``dominant_expert(routing of layer algorithm.advantage.expert_zscore_layer,
    response_mask, n_experts)``: sequences whose response tokens were routed
    most often to the same expert in that layer form one group, so each
    expert's sequences are compared with each other. std is the population std
    (ddof 0). A group of size 1, or with equal advantages, gets exactly 0
    (float64 statistics, spread below ``EQUAL_SPREAD_RTOL`` counts as none).
    Returns ``(N,)`` fp32.
    """
    a = adv.double()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    zeros = torch.zeros(n_groups, dtype=a.dtype, device=a.device)
    size = zeros.index_add(0, inverse, torch.ones_like(a))
    mean = zeros.index_add(0, inverse, a) / size
    centred = a - mean[inverse]
    std = (zeros.index_add(0, inverse, centred**2) / size).sqrt()
    z = centred / (std[inverse] + eps)
    keep = (size[inverse] > 1) & ~_flat(std, mean)[inverse]
    return torch.where(keep, z, 0.0).float()


# --------------------------------------------------------------------------- GAE
def gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float,
    block: int = 64,
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015) over response tokens.

    ``rewards, values, mask``: ``(B, T)``. Only masked positions (the response)
    are time steps; ``values[b, t]`` is the value of the state in which token t
    is chosen (aligned like the log-probs). The terminal reward sits at the
    last response token (the caller puts it there); the value after the last
    response token is 0 (no bootstrap). Per masked t:

        delta_t = r_t + gamma * V_{t+1} * mask_{t+1} - V_t
        A_t     = delta_t + gamma * lam * mask_{t+1} * A_{t+1}

    Returns ``(advantages, returns = advantages + values)``, both ``(B, T)``
    fp32 and 0 outside the mask.

    The recursion is evaluated without a Python loop over tokens: within blocks
    of ``block`` positions ``A_i = sum_j (gamma*lam)^(j-i) * link(i, j) * delta_j``,
    where link(i, j) = 1 when every position in (i, j] is masked, plus the
    discounted advantage carried in from the next block; only the
    ``ceil(T / block)`` blocks are looped over.
    """
    m = mask.to(torch.float32)
    v = values.float() * m
    r = rewards.float() * m
    next_v = torch.cat([v[:, 1:], v.new_zeros(v.shape[0], 1)], dim=1)
    delta = (r + gamma * next_v - v) * m
    # segment ids: constant along a run of masked positions, +1 at each unmasked one,
    # so link(i, j) <=> seg[i] == seg[j] for i <= j.
    seg = torch.cumsum((~mask.bool()).long(), dim=1)

    c = gamma * lam
    t_len = delta.shape[1]
    adv = torch.zeros_like(delta)
    ar = torch.arange(block, device=delta.device)
    dist = (ar[None, :] - ar[:, None]).to(torch.float32)  # j - i
    discount = torch.where(dist >= 0, c ** dist.clamp_min(0), 0.0)
    for start in reversed(range(0, t_len, block)):
        end = min(start + block, t_len)
        n = end - start
        seg_blk = seg[:, start:end]
        link = seg_blk[:, :, None] == seg_blk[:, None, :]  # (B, n, n) over (i, j)
        weight = discount[:n, :n] * link
        a = torch.einsum("bij,bj->bi", weight, delta[:, start:end])
        if end < t_len:  # carry A_end into this block: c^(end - i) * link(i, end) * A_end
            carry_discount = c ** (end - start - ar[:n]).float()
            carry_link = seg_blk == seg[:, end : end + 1]
            a = a + carry_discount * carry_link * adv[:, end : end + 1]
        adv[:, start:end] = a
    adv = adv * m
    return adv, (adv + v) * m
