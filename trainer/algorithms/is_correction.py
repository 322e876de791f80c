"""Importance-sampling corrections for the training-inference gap.

The rollout engine samples from pi_rollout, but the gradient is taken under
the training engine's pi_train. With r = pi_train_old / pi_rollout per token
(old = the training forward before the update), the corrections reweight or
drop tokens of the policy loss:

* ``tis``: truncated IS, weight min(r, C) (Yao et al., "Your efficient RL
  framework secretly brings you off-policy RL training", 2025).
* ``mis``: masked IS at the sequence level: a sequence whose geometric-mean
  ratio exp(mean_t log r) leaves [low, high] gets weight 0, others 1.
* ``icepop``: token-level band, weight r inside [low, high], 0 outside
  (Ring-1T / IcePop).

Weights are detached and multiply the per-token policy-loss term
(``losses.clipped_policy_loss(token_weights=...)``); the loss is still
normalised over the original mask, so dropped tokens lower the loss scale
rather than being renormalised away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from trainer.algorithms.losses import masked_max, masked_mean

ISMode = Literal["none", "tis", "mis", "icepop"]


@dataclass(frozen=True)
class ISStats:
    """Diagnostics (plain floats) over the masked tokens.

    clip_frac: share of tokens whose weight was truncated (TIS: r > C; 0 otherwise).
    masked_frac: share of tokens given weight 0 (MIS: tokens of dropped
        sequences; IcePop: tokens outside the band; 0 for none/tis).
    ratio_mean / ratio_max: of the token ratio r = pi_train_old / pi_rollout.
    """

    clip_frac: float
    masked_frac: float
    ratio_mean: float
    ratio_max: float


def is_weights(
    train_old_logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    mode: ISMode = "none",
    tis_cap: float = 2.0,
    mis_low: float = 0.5,
    mis_high: float = 2.0,
    icepop_low: float = 0.5,
    icepop_high: float = 5.0,
) -> tuple[Tensor, ISStats]:
    """Per-token IS weights ``(B, T)`` (detached, 0 outside ``mask``) and their stats.

    ``train_old_logp, rollout_logp, mask``: ``(B, T)``; r = exp(train_old_logp -
    rollout_logp). Bounds are inclusive: a ratio equal to a bound is kept.
    """
    m = mask.bool()
    mf = m.to(torch.float32)
    log_r = torch.where(m, train_old_logp.float() - rollout_logp.float(), 0.0).detach()
    r = torch.exp(log_r)
    zero = torch.zeros((), device=r.device)
    clip_frac = masked_frac = zero

    if mode == "none":
        weights = mf
    elif mode == "tis":
        weights = r.clamp(max=tis_cap) * mf
        clip_frac = masked_mean((r > tis_cap).float(), m)
    elif mode == "mis":
        seq_ratio = torch.exp(masked_mean(log_r, m, dim=-1))  # geometric mean, (B,)
        keep = (seq_ratio >= mis_low) & (seq_ratio <= mis_high)
        weights = keep[:, None].float() * mf
        masked_frac = masked_mean((~keep[:, None]).float().expand_as(mf), m)
    elif mode == "icepop":
        inside = (r >= icepop_low) & (r <= icepop_high)
        weights = torch.where(inside, r, 0.0) * mf
        masked_frac = masked_mean((~inside).float(), m)
    else:
        raise ValueError(f"IS correction mode must be none, tis, mis or icepop, not {mode!r}")

    stats = torch.stack([clip_frac, masked_frac, masked_mean(r, m), masked_max(r, m)]).tolist()
    return weights, ISStats(*stats)
