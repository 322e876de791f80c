"""Router temperature controller.

The router computes ``softmax(logits / T)``. Dividing by T > 0 keeps the order of
a token's logits, so the top-k SELECTION does not depend on T: temperature changes
the gate weights (the renormalised softmax of the chosen experts) and every loss
built on the probabilities (Switch aux loss, router KL), never which experts run.
Selection depends on T only once noise is added after the division (noisy top-k
gating, Shazeer et al. 2017, arXiv 1701.06538): ``topk(logits / T + noise)``. There
a higher T shrinks the logit gaps relative to the noise (more random, more even
selection) and a lower T makes the noise matter less. ``tests/trainer/
test_stabilizers_temperature.py`` checks both facts. The noise itself is part
of the router: ``trainer.model.noisy_gating``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from trainer.algorithms.measure import utilization
from trainer.config import RouterTemperatureConfig


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
