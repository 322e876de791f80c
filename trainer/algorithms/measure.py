"""Mismatch and expert metrics (docs/design.md, "metric keys"); keys from ``trainer.metric_keys``.

Training-inference mismatch is measured by a training forward on the rollout's
own tokens before the update: token log-probs (k1, k3, extreme tokens) and the
training router's natural top-k against the rollout engine's (routing
inconsistency, tokens differing in any layer, SDI). Expert metrics summarise
how routed assignments spread over experts.

Shapes follow docs/trainer-internals.md: ``(B, T)`` tensors with a bool mask
(True on the tokens that count), routing indices ``(B, T, k)`` per MoE layer.
Everything returns plain floats (or lists of floats) ready for metrics.jsonl.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor

from trainer import metric_keys as mk
from trainer.algorithms.losses import masked_max, masked_mean

# All-reduce SUM across ranks (``DistContext.sum``); None = this process only.
SumRanks = Callable[[Tensor], Tensor]

# A token is "extreme" when pi_train and pi_rollout differ by more than this factor.
EXTREME_RATIO = 2.0


# --------------------------------------------------------------------------- log-prob mismatch
def mismatch_stats(train_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """KL(rollout || train) estimates on the rollout's tokens.

    r = pi_train / pi_rollout = exp(train_logp - rollout_logp) per token;
    over the masked tokens of the batch:

    * ``mismatch/kl_k1``: mean of -log r
    * ``mismatch/kl_k3``: mean of r - 1 - log r (>= 0 per token, lower variance)
    * ``mismatch/extreme_token_frac``: share of tokens with max(r, 1/r) > 2
    * ``mismatch/kl_k3_max``: the largest per-sequence k3 mean (sequences with
      at least one masked token), which shows spikes the batch mean hides.
    """
    m = mask.bool()
    log_r = torch.where(m, train_logp.float() - rollout_logp.float(), 0.0)
    k3 = torch.expm1(log_r) - log_r
    extreme = (log_r.abs() > math.log(EXTREME_RATIO)).float()
    per_seq_k3 = masked_mean(k3, m, dim=-1)
    values = torch.stack(
        [
            masked_mean(-log_r, m),
            masked_mean(k3, m),
            masked_mean(extreme, m),
            masked_max(per_seq_k3, m.any(dim=-1)),
        ]
    ).tolist()
    keys = (
        mk.MISMATCH_KL_K1,
        mk.MISMATCH_KL_K3,
        mk.MISMATCH_EXTREME_TOKEN_FRAC,
        mk.MISMATCH_KL_K3_MAX,
    )
    return dict(zip(keys, values, strict=True))


# --------------------------------------------------------------------------- estimator health
def estimator_stats(
    old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, sum_ranks: SumRanks | None = None
) -> tuple[dict[str, float], float]:
    """How degraded the importance-sampling estimator is by the engine gap.

    rho = pi_old / pi_rollout = exp(old_logp - rollout_logp) per masked token
    (B, T); log w = sum of log rho over a sequence's masked tokens (B,). Over
    the batch (every rank's, with ``sum_ranks``):

    * ``is/chi2_token`` = mean(rho^2) - 1; ``is/chi2_seq`` = mean(w^2) - 1: the
      chi-square divergence of the two distributions, the factor by which the
      IS estimator's variance grows (verl's ``rollout_corr`` chi2 metrics).
    * ``is/ess_token`` = (sum rho)^2 / (N sum rho^2); ``is/ess_seq`` the same
      over w: the effective sample size as a share of the samples (Kong 1992).
    * ``is/seq_log_ratio_mean`` / ``_abs``: mean of log w and of |log w|.

    Returns the means and the local largest |log w| (``is/seq_log_ratio_max``,
    to be reduced with a maximum). Computed in float64: w^2 of a sequence
    with |log w| = 40 is still finite there.
    """
    m = mask.bool()
    log_rho = torch.where(m, old_logp.double() - rollout_logp.double(), 0.0)
    rho = torch.where(m, log_rho.exp(), 0.0)
    has = m.any(dim=-1)
    log_w = log_rho.sum(dim=-1)[has]
    w = log_w.exp()
    sums = torch.stack(
        [
            m.sum().double(),
            rho.sum(),
            rho.pow(2).sum(),
            has.sum().double(),
            w.sum(),
            w.pow(2).sum(),
            log_w.sum(),
            log_w.abs().sum(),
        ]
    )
    if sum_ranks is not None:
        sums = sum_ranks(sums)
    n_tok, s_rho, s_rho2, n_seq, s_w, s_w2, s_lw, s_alw = sums.tolist()
    n_tok, n_seq = max(n_tok, 1.0), max(n_seq, 1.0)

    def ess(total: float, total_sq: float, n: float) -> float:
        return total * total / (n * total_sq) if total_sq > 0 else 1.0

    means = {
        mk.IS_CHI2_TOKEN: s_rho2 / n_tok - 1.0,
        mk.IS_CHI2_SEQ: s_w2 / n_seq - 1.0,
        mk.IS_ESS_TOKEN: ess(s_rho, s_rho2, n_tok),
        mk.IS_ESS_SEQ: ess(s_w, s_w2, n_seq),
        mk.IS_SEQ_LOG_RATIO_MEAN: s_lw / n_seq,
        mk.IS_SEQ_LOG_RATIO_ABS: s_alw / n_seq,
    }
    local_max = float(log_w.abs().max()) if log_w.numel() else 0.0
    return means, local_max


# --------------------------------------------------------------------------- routing mismatch
def routing_differs(a: Tensor, b: Tensor) -> Tensor:
    """``(B, T)`` bool: True where the top-k expert SETS of ``a`` and ``b`` differ.

    ``a, b``: ``(B, T, k)`` expert ids of one layer. Order-insensitive: [1, 0]
    equals [0, 1] (gate order is not a routing decision).
    """
    a_sorted = a.long().sort(dim=-1).values
    b_sorted = b.long().sort(dim=-1).values
    return (a_sorted != b_sorted).any(dim=-1)


def routing_mismatch(a: Sequence[Tensor], b: Sequence[Tensor], mask: Tensor) -> dict[str, float]:
    """Routing disagreement between two routings of the same tokens.

    ``a, b``: one ``(B, T, k)`` index tensor per MoE layer (e.g. the rollout
    engine's and the training router's natural top-k); ``mask (B, T)``.

    * ``mismatch/routing_inconsistency``: share of masked (token, MoE layer)
      pairs whose top-k expert set differs.
    * ``mismatch/token_any_layer_frac``: share of masked tokens whose set
      differs in at least one layer.
    * ``mismatch/sdi``: mean over sequences (with >= 1 masked token) of the
      share of that sequence's masked tokens that differ in at least one layer.
    """
    if len(a) != len(b):
        raise ValueError(f"routing lists differ in length: {len(a)} vs {len(b)} layers")
    m = mask.bool()
    if not a:
        zero = {
            mk.MISMATCH_ROUTING_INCONSISTENCY: 0.0,
            mk.MISMATCH_TOKEN_ANY_LAYER_FRAC: 0.0,
            mk.MISMATCH_SDI: 0.0,
        }
        return zero
    differs = torch.stack([routing_differs(x, y) for x, y in zip(a, b, strict=True)])  # (L,B,T)
    per_token_layers = differs.float().mean(dim=0)  # share of layers differing, (B, T)
    any_layer = differs.any(dim=0).float()
    per_seq = masked_mean(any_layer, m, dim=-1)
    has_tokens = m.any(dim=-1).float()
    values = torch.stack(
        [
            masked_mean(per_token_layers, m),
            masked_mean(any_layer, m),
            (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1.0),
        ]
    ).tolist()
    keys = (mk.MISMATCH_ROUTING_INCONSISTENCY, mk.MISMATCH_TOKEN_ANY_LAYER_FRAC, mk.MISMATCH_SDI)
    return dict(zip(keys, values, strict=True))


# --------------------------------------------------------------------------- expert load
def expert_counts(indices: Tensor, mask: Tensor, n_experts: int) -> Tensor:
    """Routed assignments per expert, ``(E,)`` fp32: every masked token of
    ``indices (B, T, k)`` / ``mask (B, T)`` adds one per slot. Counts (not shares)
    are what ranks sum (trainer.distributed)."""
    k = indices.shape[-1]
    weights = mask.to(torch.float32)[..., None].expand(*mask.shape, k).reshape(-1)
    counts = torch.zeros(n_experts, dtype=torch.float32, device=indices.device)
    counts.scatter_add_(0, indices.long().reshape(-1), weights)
    return counts


def expert_load(
    indices: Tensor, mask: Tensor, n_experts: int, sum_ranks: SumRanks | None = None
) -> Tensor:
    """Share of routed assignments per expert, ``(E,)`` fp32 summing to 1.

    ``indices (B, T, k)``, ``mask (B, T)``: every masked token contributes k
    assignments (one per slot). All zeros when no token is masked. ``sum_ranks``
    (``DistContext.sum``) makes it the share over every rank's tokens.
    """
    counts = expert_counts(indices, mask, n_experts)
    if sum_ranks is not None:
        counts = sum_ranks(counts).to(torch.float32).to(indices.device)
    return counts / counts.sum().clamp_min(1.0)


def max_violation(load: Tensor) -> float:
    """MaxVio = max_e load_e * E / sum(load) - 1 (0 = perfectly balanced).

    ``load (E,)`` may be counts or shares. 0 for an empty load.
    """
    total = load.float().sum()
    if total <= 0:
        return 0.0
    return float(load.float().max() * load.numel() / total - 1.0)


def utilization(load: Tensor, threshold: float = 0.5) -> float:
    """Share of experts that receive a real part of the work.

    An expert counts as utilised when its share of the assignments is at least
    ``threshold`` times its fair share 1/E (default: half the fair share,
    1/(2E)). 1.0 = every expert used; 1/E = a single expert takes everything.
    ``load (E,)`` may be counts or shares; 0 for an empty load.
    """
    load = load.float()
    total = load.sum()
    if total <= 0:
        return 0.0
    n = load.numel()
    return float(((load / total) >= threshold / n).float().mean())


def router_entropy(probs: Tensor, mask: Tensor) -> float:
    """Mean over masked tokens of the router distribution's entropy, in nats.

    ``probs (B, T, E)`` (softmax of the router logits), ``mask (B, T)``.
    Maximum log(E) for a uniform router, 0 for a one-hot one.
    """
    p = probs.float()
    entropy = -torch.special.xlogy(p, p).sum(dim=-1)
    return float(masked_mean(entropy, mask))


class RoutingLike(Protocol):
    """What ``expert_stats`` reads from a layer's routing (``LayerRouting`` fits)."""

    probs: Tensor  # (B, T, E)
    used_indices: Tensor  # (B, T, k)


def expert_stats(
    routings: Sequence[RoutingLike | Tensor],
    mask: Tensor,
    n_experts: int,
    indices_attr: str = "used_indices",
    utilization_threshold: float = 0.5,
    sum_ranks: SumRanks | None = None,
    layer_ids: Sequence[int] | None = None,
) -> dict[str, float | list[float]]:
    """Expert metrics for one forward, one entry per MoE layer in ``routings``.

    Each entry is a ``LayerRouting``-like object (``.probs (B, T, E)`` and the
    indices named by ``indices_attr``, by default ``used_indices``: the experts
    the layer actually ran) or a bare ``(B, T, k)`` index tensor (then no router
    entropy). ``layer_ids``: each entry's block index in the model (the MoE blocks
    of a model with dense ones, e.g. DeepSeek's first_k_dense_replace; None = 0, 1,
    ...), so ``experts/load/L{i}`` names the model's layer i as the dashboards, the
    tracking API and TRL's callback do. Returns ``experts/load/L{i}`` (list of E
    shares per layer) and
    the means over layers of ``experts/utilization``, ``experts/max_violation``
    and, when probabilities are given, ``experts/router_entropy``. ``sum_ranks``
    (``DistContext.sum``) makes every number one over all ranks' tokens (counts and
    entropy sums are reduced, never per-rank means).
    """
    out: dict[str, float | list[float]] = {}
    utils, violations, entropies = [], [], []
    ids = list(range(len(routings))) if layer_ids is None else list(layer_ids)
    if len(ids) != len(routings):
        raise ValueError(f"{len(routings)} routed layers but {len(ids)} layer ids")
    for i, routing in zip(ids, routings, strict=True):
        if isinstance(routing, Tensor):
            indices, probs = routing, None
        else:
            indices, probs = getattr(routing, indices_attr), routing.probs
        load = expert_load(indices, mask, n_experts, sum_ranks)
        out[mk.experts_load(i)] = load.tolist()
        utils.append(utilization(load, utilization_threshold))
        violations.append(max_violation(load))
        if probs is not None:
            entropy = router_entropy(probs, mask)
            if sum_ranks is not None:
                n_tok = float(mask.float().sum())
                total = sum_ranks(torch.tensor([entropy * n_tok, n_tok]))
                entropy = float(total[0] / total[1]) if total[1] > 0 else 0.0
            entropies.append(entropy)
    if utils:
        out[mk.EXPERTS_UTILIZATION] = sum(utils) / len(utils)
        out[mk.EXPERTS_MAX_VIOLATION] = sum(violations) / len(violations)
    if entropies:
        out[mk.EXPERTS_ROUTER_ENTROPY] = sum(entropies) / len(entropies)
    return out
