"""Policy, value, KL and entropy terms of the RL objective.

Batch layout (docs/trainer-internals.md): tensors are ``(B, T)`` over the
whole padded sequence; ``mask`` (bool, ``(B, T)``) is True on the tokens that
count (the sampled response tokens). The log-prob of token ``t`` lives at
position ``t`` and comes from the logits at ``t - 1``.

Every function works in fp32 and is vectorised over the batch; values at
masked-out positions never reach a result (they are replaced by zeros before
any ``exp`` so padding cannot turn into ``inf * 0 = nan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token_mean", "seq_mean"]


# --------------------------------------------------------------------------- reductions
def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is True.

    ``x`` and ``mask`` broadcast together (e.g. both ``(B, T)``). ``dim=None``
    reduces everything to a scalar; an int reduces that dimension only. Empty
    selections give 0 (not nan), so a row without response tokens is harmless.
    """
    m = mask.to(torch.float32)
    x = torch.where(m != 0, x.to(torch.float32), 0.0)
    if dim is None:
        return (x * m).sum() / m.sum().clamp_min(1.0)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1.0)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Largest ``x`` where ``mask`` is True, as a 0-dim tensor; 0 when nothing is masked."""
    x = x.to(torch.float32)
    top = torch.where(mask, x, float("-inf")).amax()
    return torch.where(mask.any(), top, 0.0)


def aggregate(loss_tok: Tensor, mask: Tensor, mode: Aggregation = "token_mean") -> Tensor:
    """Reduce a per-token loss ``(B, T)`` to a scalar.

    * ``token_mean``: mean over every masked token of the batch (long responses
      weigh more, as in DAPO).
    * ``seq_mean``: mean over each sequence's masked tokens, then mean over the
      sequences that have at least one masked token (the original GRPO form).
    """
    if mode == "token_mean":
        return masked_mean(loss_tok, mask)
    if mode == "seq_mean":
        per_seq = masked_mean(loss_tok, mask, dim=-1)
        has_tokens = mask.any(dim=-1).to(torch.float32)
        return (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1.0)
    raise ValueError(f"aggregation mode must be token_mean or seq_mean, not {mode!r}")


# --------------------------------------------------------------------------- policy losses
@dataclass(frozen=True)
class PolicyStats:
    """Diagnostics of one policy-loss evaluation (plain floats, JSON-ready).

    clip_frac: share of masked tokens (GSPO: of sequences) whose clipped term
        was the active one, i.e. whose gradient the clip removed.
    ratio_max / ratio_mean: of the token ratio pi/pi_old (GSPO: of the
        sequence ratio s) over masked tokens (GSPO: over sequences).
    approx_kl: token mean of k3 = (rho - 1) - log rho with rho = pi/pi_old, an
        estimate of KL(pi_old || pi) on the pi_old samples.
    """

    clip_frac: float
    ratio_max: float
    ratio_mean: float
    approx_kl: float


def _k3_from_log_ratio(log_ratio: Tensor) -> Tensor:
    """k3 = rho - 1 - log rho for rho = exp(log_ratio) (Schulman, "Approximating KL")."""
    return torch.expm1(log_ratio) - log_ratio


def _apply_token_weights(loss_tok: Tensor, token_weights: Tensor | None) -> Tensor:
    if token_weights is None:
        return loss_tok
    w = token_weights.detach().to(torch.float32)
    # A zero weight removes the token even when its loss term is inf.
    return torch.where(w != 0, loss_tok * w, 0.0)


def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    agg: Aggregation = "token_mean",
    token_weights: Tensor | None = None,
) -> tuple[Tensor, PolicyStats]:
    """PPO / GRPO clipped surrogate with a per-token ratio (Schulman et al. 2017).

    rho_t = exp(logp_t - old_logp_t); per token the loss is
    ``-min(rho_t * A, clip(rho_t, 1 - clip_low, 1 + clip_high) * A)``, optionally
    multiplied by the detached ``token_weights`` (TIS / IcePop / MIS, see
    ``is_correction.is_weights``), then reduced by ``aggregate(..., agg)`` over
    ``mask``.

    Shapes: logp, old_logp, mask, token_weights ``(B, T)``; adv ``(B, T)`` or
    ``(B,)`` (one advantage per sequence, broadcast over its tokens).
    Returns (scalar loss, PolicyStats).
    """
    logp = logp.float()
    adv = adv.float()
    if adv.dim() == 1:
        adv = adv[:, None]
    log_ratio = torch.where(mask, logp - old_logp.float(), 0.0)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_tok = torch.maximum(unclipped, clipped)
    loss = aggregate(_apply_token_weights(loss_tok, token_weights), mask, agg)

    with torch.no_grad():
        n = mask.sum().clamp_min(1)
        stats = torch.stack(
            [
                ((clipped > unclipped) & mask).sum() / n,
                masked_max(ratio, mask),
                masked_mean(ratio, mask),
                masked_mean(_k3_from_log_ratio(log_ratio), mask),
            ]
        ).tolist()
    return loss, PolicyStats(*stats)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO's log sequence ratio ``(B,)``: mean over masked tokens of logp - old_logp,
    i.e. the log of the geometric mean of the token ratios (arXiv 2507.18071, eq. 7).
    """
    return masked_mean(logp.float() - old_logp.float(), mask, dim=-1)


def gspo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, PolicyStats]:
    """GSPO: clipped objective on the sequence-level ratio (arXiv 2507.18071).

    s_i = exp(mean_t (logp - old_logp)) over sequence i's masked tokens; the
    objective per sequence is ``min(s_i * A_i, clip(s_i, 1 - clip_low,
    1 + clip_high) * A_i)``, averaged over sequences (those with >= 1 masked
    token). Implemented in the paper's GSPO-token form: every token carries
    ``s_tok = sg(s_i) * exp(logp_t - sg(logp_t))`` (value s_i, gradient
    s_i * grad logp_t), the per-token terms are averaged over the sequence's
    tokens and then over sequences, so the gradient is
    ``-(1/G) sum_i A_i s_i (1/|y_i|) sum_t grad logp_t`` for unclipped sequences
    and 0 for clipped ones, exactly the GSPO gradient. ``token_weights`` (detached)
    multiplies each token's term.

    Shapes: logp, old_logp, mask, token_weights ``(B, T)``; adv ``(B,)`` (a
    ``(B, T)`` advantage is accepted and used token-wise, as GSPO-token allows).
    Returns (scalar loss, PolicyStats over sequences; approx_kl over tokens).
    """
    logp = logp.float()
    log_seq_ratio = sequence_log_ratio(logp, old_logp, mask)  # (B,)
    log_tok = log_seq_ratio.detach()[:, None] + logp - logp.detach()
    s_tok = torch.exp(torch.where(mask, log_tok, 0.0))
    a = adv.float()
    if a.dim() == 1:
        a = a[:, None]
    unclipped = -a * s_tok
    clipped = -a * s_tok.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_tok = torch.maximum(unclipped, clipped)
    loss = aggregate(_apply_token_weights(loss_tok, token_weights), mask, "seq_mean")

    with torch.no_grad():
        has_tokens = mask.any(dim=-1)
        n_seq = has_tokens.sum().clamp_min(1)
        s = torch.exp(log_seq_ratio)
        seq_clipped = ((clipped > unclipped) & mask).any(dim=-1)
        token_log_ratio = torch.where(mask, logp - old_logp.float(), 0.0)
        stats = torch.stack(
            [
                (seq_clipped & has_tokens).sum() / n_seq,
                masked_max(s, has_tokens),
                (torch.where(has_tokens, s, 0.0)).sum() / n_seq,
                masked_mean(_k3_from_log_ratio(token_log_ratio), mask),
            ]
        ).tolist()
    return loss, PolicyStats(*stats)


# --------------------------------------------------------------------------- KL / value / entropy
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || ref) on samples from pi, ``(B, T)``.

    r = exp(ref_logp - logp); k3 = r - 1 - log r >= 0 (Schulman 2020, as used
    by GRPO's KL penalty). Differentiable in ``logp``. The caller masks/reduces.
    """
    log_r = ref_logp.float() - logp.float()
    return _k3_from_log_ratio(log_r)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float,
    agg: Aggregation = "token_mean",
) -> Tensor:
    """Clipped PPO value loss: ``0.5 * max((V - R)^2, (V_clip - R)^2)`` reduced over mask.

    V_clip = old_V + clamp(V - old_V, -clip, clip). ``clip <= 0`` turns clipping
    off (plain ``0.5 * (V - R)^2``). Shapes ``(B, T)``; returns a scalar.
    """
    values = values.float()
    returns = returns.float()
    sq = (values - returns) ** 2
    if clip > 0:
        old_values = old_values.float()
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        sq = torch.maximum(sq, (v_clipped - returns) ** 2)
    return 0.5 * aggregate(sq, mask, agg)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy in nats of softmax(logits) over the last dim: ``(B, T, V) -> (B, T)``.

    H = logsumexp(z) - sum_v p_v z_v, which needs no log-probabilities tensor.
    """
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def gather_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """Log-prob of each token under the logits of the previous position.

    ``logits (B, T, V)``, ``tokens (B, T)`` -> ``(B, T)`` with
    ``out[b, t] = log softmax(logits[b, t - 1])[tokens[b, t]]`` and
    ``out[:, 0] = 0`` (nothing predicts the first token).

    Memory-light: ``z[token] - logsumexp(z)`` never materialises a
    ``(B, T, V)`` log-softmax result, and its backward needs only the logits
    and the ``(B, T)`` logsumexp.
    """
    z = logits[:, :-1].float()
    target = tokens[:, 1:].long()
    picked = z.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    logp = picked - torch.logsumexp(z, dim=-1)
    return torch.cat([logp.new_zeros(logp.shape[0], 1), logp], dim=1)
