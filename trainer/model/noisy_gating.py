"""Noisy top-k gating (Shazeer et al. 2017, arXiv 1701.06538): ``topk(logits / T + noise)``.

Part of the router (``trainer.model.moe.Router.enable_noise``); the RL loop only
switches it on (``stabilizers.noisy_gating``) and owns its generator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def noisy_topk_logits(
    logits: Tensor, noise_std: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """``logits + noise_std * N(0, 1)``: the scores noisy top-k gating selects from.

    ``logits (N, E)``: the temperature-scaled router logits (``logits / T``);
    ``noise_std (E,)`` or ``(N, E)``, non-negative (e.g. ``NoiseScale()`` or a
    per-token ``softplus(x @ W_noise)`` as in Shazeer et al. 2017). Use the result
    for SELECTION (``topk``) and in training only; evaluation and rollouts select
    from the clean logits. The gradient reaches ``noise_std`` only if the caller
    also puts the noisy values into a differentiable term (Shazeer's gates are the
    softmax of the noisy top-k values); with selection-only use the scale stays at
    its initial value.
    """
    noise = torch.randn(logits.shape, generator=generator, device=logits.device)
    return logits + noise.to(logits.dtype) * noise_std


class NoiseScale(nn.Module):
    """Learned per-expert noise scale ``softplus(raw)``, ``(E,)``, positive by construction."""

    def __init__(self, n_experts: int, init_std: float = 1.0) -> None:
        super().__init__()
        if init_std <= 0:
            raise ValueError(f"init_std must be positive, got {init_std}")
        # softplus^-1(s) = log(exp(s) - 1) = s + log(1 - exp(-s)), stable for large s
        raw = init_std + torch.log(-torch.expm1(torch.tensor(-init_std)))
        self.raw = nn.Parameter(raw.expand(n_experts).clone())

    def forward(self) -> Tensor:
        return F.softplus(self.raw)
