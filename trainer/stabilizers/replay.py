"""Routing replay (R3, arXiv 2510.11370; R2 from GSPO, arXiv 2507.18071): the pieces that
do not need the model.

* ``replay_keep_mask``: which (token, MoE layer) pairs replay the recorded routing during
  the warm-up, and ``replayed_fraction`` for the metric ``r3/replayed_frac``.
* ``RouterAnchor``: the router-anchoring KL regulariser over a bounded buffer of the
  routing distributions of recent steps.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from torch import Tensor


# --------------------------------------------------------------------------- warm-up schedule
def own_choice_share(step: int, warmup_steps: int, keep_frac: float) -> float:
    """Share p(step) of (token, layer) pairs that keep the training router's own choice.

    ``p = keep_frac * (1 - step / warmup_steps)`` for ``0 <= step < warmup_steps``,
    a linear shrink from ``keep_frac`` at step 0 to 0 at ``warmup_steps``; 0 after
    the warm-up and when ``warmup_steps`` is 0 (replay from the first step).
    """
    if warmup_steps <= 0 or step >= warmup_steps:
        return 0.0
    return keep_frac * (1.0 - max(step, 0) / warmup_steps)


def replay_keep_mask(
    shape: tuple[int, int],
    n_layers: int,
    step: int,
    warmup_steps: int,
    keep_frac: float,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> list[Tensor]:
    """Per MoE layer a ``BoolTensor shape=(B, T)``: True = REPLAY the recorded routing.

    False = the pair keeps the training router's own (natural) top-k. Each pair
    independently keeps its own choice with probability ``own_choice_share(step, ...)``,
    so the share follows the schedule in expectation; the draw comes from
    ``generator`` only (deterministic given its seed). When that share is 0 no
    random numbers are drawn and every mask is all True. The list is what the
    model's ``override_mask`` takes.
    """
    p = own_choice_share(step, warmup_steps, keep_frac)
    if device is None and generator is not None:
        device = generator.device
    if p <= 0.0:
        return list(torch.ones(n_layers, *shape, dtype=torch.bool, device=device).unbind(0))
    u = torch.rand(n_layers, *shape, generator=generator, device=device)
    return list((u >= p).unbind(0))


def replayed_fraction(masks: list[Tensor], token_mask: Tensor | None = None) -> float:
    """``r3/replayed_frac``: share of (token, layer) pairs that replay, over ``token_mask``.

    ``masks``: per layer ``(B, T)`` bool from ``replay_keep_mask``; ``token_mask (B, T)``:
    the tokens that count (None = all). 0 when nothing counts.
    """
    if not masks:
        return 0.0
    stacked = torch.stack(masks).float()  # (L, B, T)
    if token_mask is None:
        return float(stacked.mean())
    w = token_mask.float().expand_as(stacked)
    return float((stacked * w).sum() / w.sum().clamp_min(1.0))


# --------------------------------------------------------------------------- router anchoring
class RouterAnchor:
    """Router-anchoring KL regulariser over the routing of recent steps.

    What is stored (bounded memory, ``buffer_steps * L * E`` floats): for each of the
    last ``buffer_steps`` steps, the step's MARGINAL router distribution per MoE layer,
    q_s = mean over that step's tokens of the router softmax (several ``add`` calls in
    one step, e.g. one per minibatch, are merged token-weighted). The anchor is the
    mean of the stored q_s. Marginals need no fixed probe tokens, so any batch can be
    compared with any recorded step; anchoring each token's distribution to a marginal
    would instead pull every token towards the same routing and erase specialisation.

    ``loss(current)`` = mean over layers of KL(anchor || p), p = the current batch's
    marginal (carries the gradient). Direction: the recorded distribution is the
    reference and the current router the model, the forward (mass-covering) KL:
    it grows without bound as the current router stops sending probability to an
    expert the recent steps used (p_e -> 0 with q_e > 0), which is the collapse it is
    meant to resist; the reverse KL(p || anchor) lets p drop experts cheaply
    (mode-seeking). In ``torch.nn.functional.kl_div`` terms this is
    ``kl_div(p.log(), anchor, reduction="sum")``: the first argument must be the
    current LOG-probabilities and the second the reference probabilities (passing raw
    logits for both, as a widely copied snippet does, computes neither KL).

    The coefficient (config ``router_kl_coef``, e.g. 0.1) is applied by the caller.
    Call ``loss`` before ``add`` in a step, so a step is not anchored to itself.
    """

    def __init__(self, buffer_steps: int, eps: float = 1e-8) -> None:
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
        self.buffer_steps = buffer_steps
        self.eps = eps
        # one entry per step: [step, sum of token distributions (L, E), token count]
        self._entries: deque[list[Any]] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _token_sum(probs: Tensor, mask: Tensor | None) -> tuple[Tensor, float]:
        """``probs (N, E)`` or ``(L, N, E)`` -> (sum over masked tokens ``(L, E)``, count)."""
        p = probs.detach().float()
        if p.dim() == 2:
            p = p.unsqueeze(0)
        if mask is None:
            return p.sum(dim=1), float(p.shape[1])
        w = mask.to(torch.float32).reshape(1, -1, 1)
        return (p * w).sum(dim=1), float(w.sum())

    def _current_marginal(self, probs: Tensor, mask: Tensor | None) -> Tensor:
        p = probs.float()
        if p.dim() == 2:
            p = p.unsqueeze(0)
        if mask is None:
            return p.mean(dim=1)
        w = mask.to(torch.float32).reshape(1, -1, 1)
        return (p * w).sum(dim=1) / w.sum().clamp_min(1.0)

    def add(self, step: int, probs: Tensor, mask: Tensor | None = None) -> None:
        """Record the router softmax of step ``step`` (detached).

        ``probs (N, E)`` for one MoE layer or ``(L, N, E)`` for all; ``mask (N,)``
        the tokens that count (None = all). Steps must not decrease; steps older
        than the last ``buffer_steps`` are dropped.
        """
        total, count = self._token_sum(probs, mask)
        if count <= 0:
            return
        if self._entries and step < self._entries[-1][0]:
            raise ValueError(f"step {step} is older than the last recorded step")
        if self._entries and self._entries[-1][0] == step:
            self._entries[-1][1] = self._entries[-1][1].to(total.device) + total
            self._entries[-1][2] += count
        else:
            self._entries.append([step, total, count])
        while len(self._entries) > self.buffer_steps:
            self._entries.popleft()

    def anchor(self) -> Tensor | None:
        """The mean of the recorded per-step marginals, ``(L, E)``; None when empty."""
        if not self._entries:
            return None
        device = self._entries[-1][1].device  # entries restored from a checkpoint are on CPU
        per_step = torch.stack([total.to(device) / count for _, total, count in self._entries])
        return per_step.mean(dim=0)

    def loss(self, current_probs: Tensor, mask: Tensor | None = None) -> Tensor:
        """KL(anchor || current marginal), mean over layers; 0 with an empty buffer.

        ``current_probs (N, E)`` or ``(L, N, E)``, the same layer layout as ``add``.
        """
        q = self.anchor()
        if q is None:
            return current_probs.new_zeros((), dtype=torch.float32)
        p = self._current_marginal(current_probs, mask)
        if p.shape != q.shape:
            raise ValueError(
                f"router distribution shape {tuple(p.shape)} != recorded {tuple(q.shape)}"
            )
        q = q.to(p.device)
        kl = (torch.special.xlogy(q, q) - q * torch.log(p.clamp_min(self.eps))).sum(dim=-1)
        return kl.mean()

    def state_dict(self) -> dict[str, Any]:
        return {
            "buffer_steps": self.buffer_steps,
            "steps": [int(s) for s, _, _ in self._entries],
            "sums": [total.cpu() for _, total, _ in self._entries],
            "counts": [float(c) for _, _, c in self._entries],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer_steps = int(state["buffer_steps"])
        self._entries = deque(
            [s, total.float(), c]
            for s, total, c in zip(state["steps"], state["sums"], state["counts"], strict=True)
        )
