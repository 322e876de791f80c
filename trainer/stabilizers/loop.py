"""The stabilizers inside the RL loop: one ``Stabilizers`` object per run.

Every technique is a config switch (``cfg.stabilizers``); with all of them off the
object only ships the engine's routing and reports its storage. Per step, in
loop order (``trainer/run/runner.py``, ``trainer/run/update.py``):

    ship_routing          (trainer.rollout.data) the engine's routing travels bit-packed
                          (rollout.routing_pack.pack_routing) and is unpacked for training
    begin_step            R3 warm-up: this step's (token, layer) replay mask
    routing_for_measure   what the old-log-prob forward replays (R3 only)
    observe               the measure forward's routing: the step's expert loads and
                          router marginals
    routing_for_update    what each update minibatch replays (R3 or R2)
    routing_loss          aux + z + router-KL loss from the minibatch forward's routing
    backward              plain backward, or gradient surgery policy vs routing loss
    clip_experts          per-expert gradient clipping, before the global clip
    end_step              aux-free bias, router-anchor buffer, temperature controller

Which tensors the controllers read (one definition for all of them): the step's
LOAD is ``measure.expert_load`` of the router's NATURAL top-k in the measure
forward (no grad, no noise, before the update) over real tokens. It includes the
aux-free bias, so the bias sees the effect of its own correction; under replay it
still describes the router, not the replayed engine routing.

Everything that changes across steps is in ``state_dict`` (generators, the
anchor buffer, the temperature controller) or in the policy's own state_dict
(``selection_bias`` and ``temperature`` buffers, the noise scale), so a resumed
run continues bit-for-bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from trainer import metric_keys as K
from trainer.algorithms.balance import aux_free_bias_update, router_z_loss, switch_aux_loss
from trainer.algorithms.measure import expert_load
from trainer.config import ExperimentConfig
from trainer.distributed import SINGLE, DistContext
from trainer.model import LayerRouting, TransformerLM
from trainer.stabilizers.expert_clip import clip_expert_params_
from trainer.stabilizers.replay import (
    RouterAnchor,
    replay_keep_mask,
    replayed_fraction,
)
from trainer.stabilizers.surgery_step import surgery_backward, surgery_metrics
from trainer.stabilizers.temperature import RouterTemperatureController

if TYPE_CHECKING:
    from trainer.rollout.data import RolloutData

Replay = tuple[list[Tensor] | None, list[Tensor] | None]

# Offsets from run.seed of the stabilizers' own generators (the loop's own are +0, +1).
_REPLAY_SEED_OFFSET = 2
_NOISE_SEED_OFFSET = 3


def is_router_param(name: str) -> bool:
    """Router weights (and the noise scale): ``blocks.{i}.ffn.router.*``."""
    return ".router." in name


def is_expert_param(name: str) -> bool:
    """Stacked expert weights (expert on dim 0): ``blocks.{i}.ffn.experts.w_*``."""
    return ".experts." in name


# --------------------------------------------------------------------------- the run's stabilizers
class Stabilizers:
    """Routing replay, balancing losses and controllers, surgery and clipping of one run.

    ``Stabilizers(cfg, policy, device)`` enables noisy gating on ``policy`` (so build
    it after the frozen reference is copied and before the optimiser is) and sets the
    router temperature to ``router_temperature.initial``.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        policy: TransformerLM,
        device: torch.device,
        dist: DistContext = SINGLE,
    ):
        self.cfg = cfg
        # Loads and balance losses are over every rank's tokens (trainer.distributed).
        self.dist = dist
        self._sum_ranks = dist.sum if dist.enabled else None
        self.st = cfg.stabilizers
        self.policy = policy
        self.n_experts = cfg.model.n_experts
        self.replay_generator = torch.Generator(device=device).manual_seed(
            cfg.run.seed + _REPLAY_SEED_OFFSET
        )
        self.noise_generator: torch.Generator | None = None
        if self.st.noisy_gating.enabled:
            self.noise_generator = torch.Generator(device=device).manual_seed(
                cfg.run.seed + _NOISE_SEED_OFFSET
            )
            policy.enable_noisy_gating(self.st.noisy_gating.init_std, self.noise_generator)
        self.anchor = (
            RouterAnchor(self.st.balance.router_kl_buffer_steps)
            if self.st.balance.router_kl_coef > 0
            else None
        )
        self.temperature = RouterTemperatureController(self.st.router_temperature)
        if cfg.model.is_moe:
            policy.set_router_temperature(self.temperature.temperature)
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.surgery_scope = (
            self.params
            if self.st.surgery.scope == "all"
            else [p for n, p in policy.named_parameters() if p.requires_grad and is_router_param(n)]
        )
        # Per-step observations of the measure forward, consumed by end_step.
        self._loads: list[Tensor] | None = None
        self._probs: Tensor | None = None
        self._probs_mask: Tensor | None = None

    @property
    def needs_routing(self) -> bool:
        """Whether update forwards must return routing (a balance loss is on)."""
        return self.st.balance.has_routing_loss

    # ------------------------------------------------------------------ replay
    def begin_step(self, step: int, data: RolloutData) -> dict[str, float]:
        """R3: draw this step's replay mask (warm-up) into ``data.replay_mask``.

        The same mask serves the measure forward and every minibatch of the step,
        so the old log-probs and the updates see the same routing. True = replay
        the engine's experts; pairs the engine never saw are never replayed.
        """
        if self.st.replay.mode != "r3" or data.rollout_routing is None:
            return {}
        seen = data.routing_mask & data.attention_mask
        keep = replay_keep_mask(
            tuple(seen.shape),
            len(data.rollout_routing),
            step,
            self.st.replay.warmup_steps,
            self.st.replay.warmup_keep_frac,
            self.replay_generator,
            device=seen.device,
        )
        data.replay_mask = [mask & seen for mask in keep]
        frac = replayed_fraction(data.replay_mask, seen)
        # Weighted by this rank's (token, layer) pairs: the share over all ranks.
        weight = float(seen.sum()) * len(keep)
        return self.dist.weighted_means({K.R3_REPLAYED_FRAC: (frac, weight)})

    def routing_for_measure(self, data: RolloutData) -> Replay:
        """R3 replays the engine's routing in the old-log-prob forward too; R2's old
        routing IS that forward's own, so nothing is replayed there."""
        if self.st.replay.mode == "r3" and data.replay_mask is not None:
            return data.rollout_routing, data.replay_mask
        return None, None

    def routing_for_update(self, data: RolloutData, rows: Tensor | slice) -> Replay:
        """Routing replayed in an update minibatch, or (None, None).

        R3 (arXiv 2510.11370): the rollout engine's routing. R2 (GSPO, arXiv
        2507.18071): the old policy's natural routing from the measure forward, which
        fixes drift between minibatches, not the engine gap.
        """
        mode = self.st.replay.mode
        if mode == "r3" and data.replay_mask is not None:
            return (
                [idx[rows] for idx in data.rollout_routing],
                [mask[rows] for mask in data.replay_mask],
            )
        if mode == "r2" and data.old_routing is not None:
            mask = data.attention_mask[rows]
            return [idx[rows] for idx in data.old_routing], [mask] * len(data.old_routing)
        return None, None

    # ------------------------------------------------------------------ observation
    def observe(self, routing: list[LayerRouting], mask: Tensor) -> None:
        """The measure forward's routing (``mask (B, T)``: real tokens) for end_step."""
        self._loads = [
            expert_load(r.natural_indices, mask, self.n_experts, self._sum_ranks) for r in routing
        ]
        if self.anchor is not None:
            self._probs = torch.stack([r.probs.reshape(-1, self.n_experts) for r in routing])
            self._probs_mask = mask.reshape(-1)

    # ------------------------------------------------------------------ losses
    def routing_loss(
        self, routing: list[LayerRouting] | None, mask: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        """``aux_loss_coef * aux + z_loss_coef * z + router_kl_coef * KL`` of a forward.

        ``routing``: the minibatch forward's (``return_routing=True``); ``mask (B, T)``
        the real tokens. Each term is the mean over MoE layers, so the coefficients
        do not scale with depth; the metrics ``lb/*`` are the terms without their
        coefficients (aux: 1 = uniform). The aux loss counts assignments of the
        router's natural top-k (``lb_from_natural_routing``, as Megatron does under
        replay) or of the experts actually used. Returns a 0-dim tensor (without a
        graph when no term is on) and the metrics.
        """
        st = self.st.balance
        stats: dict[str, float] = {}
        zero = torch.zeros((), device=mask.device)
        if not self.needs_routing or not routing:
            return zero, stats
        e = self.n_experts
        b, t = mask.shape
        flat_mask = mask.reshape(-1)
        probs = [r.probs.reshape(-1, e) for r in routing]
        terms: list[Tensor] = []
        if st.aux_loss_coef > 0:
            seq_ids = torch.arange(b, device=mask.device).repeat_interleave(t)
            per_layer = []
            for p, r in zip(probs, routing, strict=True):
                idx = r.natural_indices if st.lb_from_natural_routing else r.used_indices
                per_layer.append(
                    switch_aux_loss(
                        p,
                        idx.reshape(-1, idx.shape[-1]),
                        e,
                        flat_mask,
                        scope=st.aux_loss_scope,
                        seq_ids=seq_ids,
                        sum_ranks=self._sum_ranks,
                        world_size=self.dist.world_size,
                    )
                )
            aux = torch.stack(per_layer).mean()
            stats[K.LB_AUX_LOSS] = self._rank_mean(aux)
            terms.append(st.aux_loss_coef * aux)
        if st.z_loss_coef > 0:
            z = torch.stack(
                [
                    router_z_loss(
                        r.logits.reshape(-1, e), flat_mask, self._sum_ranks, self.dist.world_size
                    )
                    for r in routing
                ]
            )
            z = z.mean()
            stats[K.LB_Z_LOSS] = self._rank_mean(z)
            terms.append(st.z_loss_coef * z)
        if self.anchor is not None:
            kl = self.anchor.loss(torch.stack(probs), flat_mask)
            stats[K.LB_ROUTER_KL] = kl.item()
            terms.append(st.router_kl_coef * kl)
        return torch.stack(terms).sum(), stats

    def _rank_mean(self, share: Tensor) -> float:
        """The global value of a loss whose ranks' shares average to it (their sum / W)."""
        if not self.dist.enabled:
            return share.item()
        return float(self.dist.sum(share.reshape(1))[0]) / self.dist.world_size

    # ------------------------------------------------------------------ gradients
    def backward(self, policy_loss: Tensor, routing_loss: Tensor) -> dict[str, float]:
        """Gradients of ``policy_loss + routing_loss`` into ``.grad``.

        ``policy_loss`` is everything but the routing terms (policy, KL to the
        reference, entropy, value). With ``surgery.enabled`` the routing-loss
        gradient is projected off the policy gradient on the scope when they
        conflict (PCGrad); returns ``grads/cos_policy_aux`` and ``grads/surgery_frac``
        of this minibatch (means over minibatches are the step's).
        """
        if not self.st.surgery.enabled:
            (policy_loss + routing_loss).backward()
            return {}
        stats = surgery_backward(self.params, policy_loss, routing_loss, self.surgery_scope)
        return surgery_metrics([stats])

    def clip_experts(self) -> None:
        """Per-expert gradient clipping (``optim.per_expert_grad_clip`` > 0), in place."""
        if self.cfg.optim.per_expert_grad_clip > 0:
            clip_expert_params_(
                self.policy.named_parameters(), self.cfg.optim.per_expert_grad_clip, is_expert_param
            )

    # ------------------------------------------------------------------ controllers
    @torch.no_grad()
    def end_step(self, step: int) -> dict[str, float]:
        """After the update: the controllers act on the step's observed routing; returns
        the selection bias's metrics (``selection_bias_metrics``).

        * aux-free bias (Wang et al. 2024, arXiv 2408.15664; DeepSeek-V3):
          ``bias += u * sign(mean load - load)`` per layer,
          on the routers' ``selection_bias`` buffer (selection only; the rollout
          engine gets it with the next weight sync);
        * router anchor: record this step's router marginals (after this step's
          losses used the buffer, so a step is never anchored to itself);
        * temperature controller: ``update(step + 1, loads)`` gives the temperature
          of the next step's rollout and update (``set_router_temperature``; the
          engine reads the ``temperature`` buffer from the state_dict).
        """
        loads, self._loads = self._loads, None
        if loads is None:
            return {}
        if self.st.balance.aux_free_bias:
            for layer, load in zip(self.policy.moe_layers, loads, strict=True):
                bias = layer.router.selection_bias
                bias.copy_(aux_free_bias_update(bias, load, self.st.balance.aux_free_bias_rate))
        if self.anchor is not None and self._probs is not None:
            self.anchor.add(step, self._probs, self._probs_mask)
            self._probs = self._probs_mask = None
        if self.st.router_temperature.enabled:
            self.policy.set_router_temperature(self.temperature.update(step + 1, loads))
        return self.selection_bias_metrics()

    def selection_bias_metrics(self) -> dict[str, float]:
        """``router/selection_bias_*`` of the routers' biases now: logged while the
        aux-free stabilizer trains them or the model carries one (a DeepSeek-V3
        checkpoint's correction bias); nothing for a model that has none."""
        biases = [layer.router.selection_bias.float() for layer in self.policy.moe_layers]
        if not biases or not (self.st.balance.aux_free_bias or any(b.any() for b in biases)):
            return {}
        stacked = torch.stack(biases)  # (L_moe, E); identical on every rank
        spread = stacked.max(dim=-1).values - stacked.min(dim=-1).values
        return {
            K.ROUTER_SELECTION_BIAS_ABS_MEAN: float(stacked.abs().mean()),
            K.ROUTER_SELECTION_BIAS_SPREAD: float(spread.mean()),
        }

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {
            "replay_generator": self.replay_generator.get_state(),
            "noise_generator": (
                self.noise_generator.get_state() if self.noise_generator is not None else None
            ),
            "anchor": self.anchor.state_dict() if self.anchor is not None else None,
            "temperature": self.temperature.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.replay_generator.set_state(state["replay_generator"])
        if self.noise_generator is not None:
            self.noise_generator.set_state(state["noise_generator"])
        if self.anchor is not None:
            self.anchor.load_state_dict(state["anchor"])
        self.temperature.load_state_dict(state["temperature"])
