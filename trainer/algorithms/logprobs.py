"""Log-probabilities and entropy from the LM head at the positions that need them.

An RL step scores only response tokens: log p(token t) comes from the logits
at t - 1, for t a response position; the policy entropy, in the convention of
``losses.entropy_from_logits`` aggregated over the response mask, from the
logits at the response positions themselves. The prompt's other positions
need no logits at all. With ``optim.logprobs=response`` the training forward
applies its LM head only at ``head_positions`` (``TransformerLM.forward``'s
``logit_positions``) and one fused log-softmax serves both the log-probs and
the entropy, instead of a (B, T, V) head, a logsumexp and a softmax over every
position (at the 15.5M Qwen3-MoE's vocabulary of 4,096 the head and its
log-softmax were most of the measurement forward's time on the CPU).

Packed logits: (N, V), one row per True entry of ``positions`` (B, T) in
row-major order (``positions.nonzero()``'s order). The results at the
positions that matter equal ``losses.gather_logprobs`` and
``losses.entropy_from_logits`` to fp32 rounding (log_softmax against z minus
logsumexp); elsewhere they are 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def head_positions(response_mask: Tensor, entropy: bool) -> Tensor:
    """(B, T) bool: where the LM head is needed: t when token t + 1 is a response
    token (its log-prob), and with ``entropy`` the response positions too."""
    need = torch.zeros_like(response_mask, dtype=torch.bool)
    need[:, :-1] = response_mask[:, 1:]
    return need | response_mask.bool() if entropy else need


def scaled(logits: Tensor, temperature: float) -> Tensor:
    """logits / temperature, fp32; at temperature 1 the logits themselves (x / 1 == x)."""
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def packed_logprobs(
    logits: Tensor, tokens: Tensor, positions: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """logits: (N, V) packed at ``positions`` (B, T); tokens (B, T). Returns
    (logp (B, T) with ``logp[b, t + 1] = log softmax(logits at (b, t) / T)[tokens[b, t + 1]]``
    and 0 where no logits were computed, the (N, V) log-softmax of logits / T)."""
    lsm = torch.log_softmax(scaled(logits, temperature), dim=-1)
    rows, cols = positions.nonzero(as_tuple=True)
    width = tokens.shape[1]
    has_next = cols < width - 1
    following = tokens[rows, (cols + 1).clamp(max=width - 1)]
    picked = lsm.gather(-1, following[:, None]).squeeze(-1)
    out = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    out = out.index_put((rows[has_next], cols[has_next] + 1), picked[has_next])
    return out, lsm


def packed_entropy(log_softmax: Tensor, positions: Tensor) -> Tensor:
    """Entropy in nats of each packed row's distribution, H = -sum p log p, at its
    position (B, T); 0 elsewhere. ``log_softmax``: (N, V) rows at ``positions``."""
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    out = torch.zeros(positions.shape, dtype=entropy.dtype, device=entropy.device)
    return out.masked_scatter(positions, entropy)
