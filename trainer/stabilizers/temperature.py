"""Router temperature controller and noisy top-k gating.

The router computes ``softmax(logits / T)``. Dividing by T > 0 keeps the order of
a token's logits, so the top-k SELECTION does not depend on T: temperature changes
the gate weights (the renormalised softmax of the chosen experts) and every loss
built on the probabilities (Switch aux loss, router KL), never which experts run.
Selection depends on T only once noise is added after the division (noisy top-k
gating, Shazeer et al. 2017, arXiv 1701.06538): ``topk(logits / T + noise)``. There
a higher T shrinks the logit gaps relative to the noise (more random, more even
selection) and a lower T makes the noise matter less. ``tests/trainer/
test_stabilizers_temperature.py`` checks both facts.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.config import RouterTemperatureConfig
from trainer.measure import utilization


class RouterTemperatureController:
    """Adapts the router temperature from expert loads (config ``router_temperature``).

    ``update(step, loads)`` acts on check steps only: ``step > 0`` and
    ``step % interval == 0`` (step 0 has seen no training). On a check step, with
    the loads of every MoE layer (shares or counts, ``(E,)`` each):

    * monopoly, i.e. some layer's largest share exceeds ``monopoly_share / E``:
      ``T *= heat_factor`` (flatten the router);
    * otherwise, when the mean over layers of ``measure.utilization`` is below
      ``min_utilization``: ``T *= cool_factor``;

    then T is clamped to ``[min_temperature, max_temperature]``. When both conditions
    hold, monopoly wins: it is the more specific symptom (one expert taking the
    work usually also leaves others idle, so cooling would otherwise answer every
    monopoly by sharpening the router further, the opposite of the remedy).

    The directions are the config's (the issue's recipe: cool on low utilization,
    heat on monopoly); without noisy gating they change gate weights and balance
    losses, not selection (module docstring). A disabled config keeps T at
    ``initial``. The last action is in ``last_action`` ("heat", "cool" or None).
    """

    def __init__(self, cfg: RouterTemperatureConfig) -> None:
        self.cfg = cfg
        self.temperature = float(cfg.initial)
        self.last_action: str | None = None

    def is_check_step(self, step: int) -> bool:
        return self.cfg.enabled and step > 0 and step % self.cfg.interval == 0

    def update(self, step: int, loads: list[Tensor]) -> float:
        """The temperature to use from ``step`` on; ``loads``: per MoE layer ``(E,)``."""
        self.last_action = None
        if not self.is_check_step(step) or not loads:
            return self.temperature
        cfg = self.cfg
        shares = [load.float() / load.float().sum().clamp_min(1e-12) for load in loads]
        monopoly = any(float(s.max()) > cfg.monopoly_share / s.numel() for s in shares)
        mean_util = sum(utilization(load) for load in loads) / len(loads)
        if monopoly:
            self.temperature *= cfg.heat_factor
            self.last_action = "heat"
        elif mean_util < cfg.min_utilization:
            self.temperature *= cfg.cool_factor
            self.last_action = "cool"
        self.temperature = min(max(self.temperature, cfg.min_temperature), cfg.max_temperature)
        return self.temperature

    def state_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.temperature = float(state["temperature"])


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
