"""Measurement forward, advantages and the off-policy policy update.

``measure_batch`` runs ONE training forward over the rollout tokens before any
update: it yields the old log-probs the clipped objective needs, and the
training-inference mismatch the study is about (the rollout engine's log-probs
and routing against the training engine's). ``PolicyUpdater.update`` then
takes several minibatch steps (x epochs) on the same batch, which is the
off-policy setting in which MoE instability shows.

The stabilizers (routing replay, balance losses, surgery, per-expert clipping,
controllers) live in ``trainer.stabilizers.loop.Stabilizers``; this module only
calls them at their places in the forward/backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainer import metric_keys as K
from trainer.algorithms.advantages import (
    RewardNormalizer,
    dominant_expert,
    expert_zscore_advantages,
    gae,
    grpo_advantages,
)
from trainer.algorithms.is_correction import is_weights
from trainer.algorithms.losses import (
    aggregate,
    clipped_policy_loss,
    entropy_from_logits,
    gather_logprobs,
    gspo_policy_loss,
    kl_k3,
    masked_mean,
    value_loss,
)
from trainer.config import ExperimentConfig
from trainer.measure import expert_stats, mismatch_stats, routing_mismatch
from trainer.model import TransformerLM
from trainer.stabilizers.loop import Stabilizers, is_expert_param, is_router_param, ship_routing


@dataclass
class RolloutData:
    """One rollout batch on the training device; tensors are (B, T) unless noted."""

    tokens: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    rollout_logp: torch.Tensor
    rewards: torch.Tensor  # (B,)
    rollout_routing: list[torch.Tensor] | None  # per MoE layer (B, T, k), rollout engine
    routing_mask: torch.Tensor | None  # True where the engine recorded routing
    routing_bytes_per_token_layer: float | None = None
    # R3: per MoE layer (B, T), True = replay the engine's routing (Stabilizers.begin_step)
    replay_mask: list[torch.Tensor] | None = None
    # Filled by measure_batch:
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    old_routing: list[torch.Tensor] | None = None  # training forward's natural top-k
    extras: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_rollout(cls, rollout, rewards: torch.Tensor, compression: str = "none") -> RolloutData:
        """The engine's routing arrives bit-packed with ``compression`` and is unpacked."""
        routing = rollout.routing
        shipped = ship_routing(routing, compression) if routing is not None else None
        return cls(
            tokens=rollout.tokens,
            attention_mask=rollout.attention_mask,
            response_mask=rollout.response_mask,
            rollout_logp=rollout.logprobs,
            rewards=rewards,
            rollout_routing=shipped.indices if shipped is not None else None,
            routing_mask=shipped.mask if shipped is not None else None,
            routing_bytes_per_token_layer=(
                shipped.bytes_per_token_layer if shipped is not None else None
            ),
        )

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]


@torch.no_grad()
def measure_batch(
    cfg: ExperimentConfig,
    policy: TransformerLM,
    updater: PolicyUpdater,
    data: RolloutData,
) -> dict[str, Any]:
    """Old log-probs, reference log-probs, values and the mismatch metrics.

    Call ``updater.stabilizers.begin_step`` first (it draws the step's R3 mask).
    Eval mode: no noisy gating here, the old policy is the deterministic router.
    """
    policy.eval()
    is_moe = cfg.model.is_moe
    stabilizers = updater.stabilizers
    override, override_mask = stabilizers.routing_for_measure(data)
    out = policy(
        data.tokens,
        attention_mask=data.attention_mask,
        routing_override=override,
        override_mask=override_mask,
        return_routing=is_moe,
    )
    # The engine's log-probs are of its sampling distribution (logits / T): compare like with like.
    data.old_logp = gather_logprobs(out.logits / cfg.rollout.temperature, data.tokens)
    data.old_values = out.values
    metrics: dict[str, Any] = dict(
        mismatch_stats(data.old_logp, data.rollout_logp, data.response_mask)
    )

    if is_moe and out.routing is not None:
        data.old_routing = [r.natural_indices for r in out.routing]
        stabilizers.observe(out.routing, data.attention_mask)
        seen = data.attention_mask
        if data.rollout_routing is not None:
            seen = seen & data.routing_mask
            # Natural choice of the training router vs the engine: the gap itself,
            # measured even when replay hides it from training.
            natural = routing_mismatch(data.old_routing, data.rollout_routing, seen)
            metrics.update(natural)
            # Without replay the layers used their natural choice: the same number, not recomputed.
            effective = natural
            if override is not None:
                effective = routing_mismatch(
                    [r.used_indices for r in out.routing], data.rollout_routing, seen
                )
            metrics[K.MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY] = effective[
                K.MISMATCH_ROUTING_INCONSISTENCY
            ]
        metrics.update(expert_stats(out.routing, data.attention_mask, cfg.model.n_experts))
        metrics[K.ROUTER_TEMPERATURE] = float(policy.moe_layers[0].router.temperature)
        if data.routing_bytes_per_token_layer is not None:
            metrics[K.R3_BYTES_PER_TOKEN_LAYER] = float(data.routing_bytes_per_token_layer)

    if updater.reference is not None:
        ref_out = updater.reference(
            data.tokens,
            attention_mask=data.attention_mask,
            routing_override=override,
            override_mask=override_mask,
        )
        data.ref_logp = gather_logprobs(ref_out.logits / cfg.rollout.temperature, data.tokens)
    return metrics


class PolicyUpdater:
    """Advantages + the clipped-objective update over minibatches and epochs."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        policy: TransformerLM,
        reference: TransformerLM | None,
        shuffle_generator: torch.Generator,
        stabilizers: Stabilizers | None = None,
    ):
        self.cfg = cfg
        self.policy = policy
        self.reference = reference
        self.shuffle_generator = shuffle_generator
        # Built before the optimiser: noisy gating adds the routers' noise-scale parameters.
        device = next(policy.parameters()).device
        self.stabilizers = stabilizers or Stabilizers(cfg, policy, device)
        self.optimizer = torch.optim.AdamW(
            self._param_groups(),
            lr=cfg.optim.lr,
            betas=(cfg.optim.beta1, cfg.optim.beta2),
            weight_decay=cfg.optim.weight_decay,
        )
        self.reward_normalizer = RewardNormalizer(decay=cfg.algorithm.advantage.ema_decay)

    def _param_groups(self) -> list[dict[str, Any]]:
        """Expert and router parameters get their own learning-rate multipliers."""
        st = self.cfg.stabilizers
        groups: dict[str, list[torch.nn.Parameter]] = {"expert": [], "router": [], "other": []}
        for name, param in self.policy.named_parameters():
            if is_router_param(name):
                groups["router"].append(param)
            elif is_expert_param(name):
                groups["expert"].append(param)
            else:
                groups["other"].append(param)
        scale = {"expert": st.expert_lr_scale, "router": st.router_lr_scale, "other": 1.0}
        return [
            {"params": params, "name": name, "lr_scale": scale[name]}
            for name, params in groups.items()
            if params
        ]

    # -- advantages ------------------------------------------------------------------
    def advantages(self, data: RolloutData) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(advantages, returns): (B,) for GRPO/GSPO, (B, T) for PPO."""
        algo = self.cfg.algorithm
        if algo.name == "ppo":
            token_rewards = torch.zeros_like(data.old_logp)
            last = _last_true_index(data.response_mask)
            token_rewards[torch.arange(data.batch_size), last] = data.rewards
            adv, returns = gae(
                token_rewards,
                data.old_values.detach(),
                data.response_mask,
                gamma=algo.gamma,
                lam=algo.gae_lambda,
            )
            mean = masked_mean(adv, data.response_mask)
            std = masked_mean((adv - mean) ** 2, data.response_mask).sqrt()
            return (adv - mean) / (std + 1e-6) * data.response_mask, returns
        rewards = data.rewards
        if algo.advantage.ema_decay > 0:
            self.reward_normalizer.update(rewards)
            rewards = self.reward_normalizer.normalize(rewards)
        adv = grpo_advantages(
            rewards, self.cfg.rollout.group_size, std_normalize=algo.advantage.std_normalize
        )
        if algo.advantage.expert_zscore and data.old_routing is not None:
            layer = algo.advantage.expert_zscore_layer
            groups = dominant_expert(
                data.old_routing[layer], data.response_mask, self.cfg.model.n_experts
            )
            adv = expert_zscore_advantages(adv, groups)
        return adv, None

    # -- update ----------------------------------------------------------------------
    def update(
        self, data: RolloutData, step: int, *, lr: float, entropy_coef: float
    ) -> dict[str, Any]:
        cfg = self.cfg
        algo = cfg.algorithm
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        advantages, returns = self.advantages(data)
        weights, is_stats = is_weights(
            data.old_logp,
            data.rollout_logp,
            data.response_mask,
            mode=cfg.stabilizers.is_correction,
            tis_cap=cfg.stabilizers.tis_cap,
            mis_low=cfg.stabilizers.mis_low,
            mis_high=cfg.stabilizers.mis_high,
            icepop_low=cfg.stabilizers.icepop_low,
            icepop_high=cfg.stabilizers.icepop_high,
        )

        self.policy.train()
        totals: dict[str, list[float]] = {}
        finite = True
        n = data.batch_size
        n_mb = min(algo.minibatches, n)
        for _ in range(algo.epochs):
            order = torch.randperm(n, generator=self.shuffle_generator).to(data.tokens.device)
            for rows in order.chunk(n_mb):
                stats = self._minibatch_step(data, rows, advantages, returns, weights, entropy_coef)
                finite &= stats.pop("_finite")
                for key, value in stats.items():
                    totals.setdefault(key, []).append(value)

        metrics = {key: sum(v) / len(v) for key, v in totals.items() if key != K.POLICY_RATIO_MAX}
        if K.POLICY_RATIO_MAX in totals:
            metrics[K.POLICY_RATIO_MAX] = max(totals[K.POLICY_RATIO_MAX])
        if cfg.stabilizers.is_correction != "none":
            metrics.update(
                {
                    K.TIS_CLIP_FRAC: float(is_stats.clip_frac),
                    K.TIS_MASKED_FRAC: float(is_stats.masked_frac),
                    K.TIS_RATIO_MEAN: float(is_stats.ratio_mean),
                    K.TIS_RATIO_MAX: float(is_stats.ratio_max),
                }
            )
        metrics["_finite"] = finite
        return metrics

    def _minibatch_step(self, data, rows, advantages, returns, weights, entropy_coef):
        cfg = self.cfg
        algo = cfg.algorithm
        tokens = data.tokens[rows]
        mask = data.response_mask[rows]
        stabilizers = self.stabilizers
        override, override_mask = stabilizers.routing_for_update(data, rows)
        out = self.policy(
            tokens,
            attention_mask=data.attention_mask[rows],
            routing_override=override,
            override_mask=override_mask,
            return_routing=stabilizers.needs_routing,
        )
        logp = gather_logprobs(out.logits / cfg.rollout.temperature, tokens)
        old_logp = data.old_logp[rows]
        token_weights = weights[rows] if cfg.stabilizers.is_correction != "none" else None
        if algo.name == "gspo":
            policy_loss, pstats = gspo_policy_loss(
                logp, old_logp, advantages[rows], mask,
                algo.clip_eps_low, algo.clip_eps_high, token_weights=token_weights,
            )  # fmt: skip
        else:
            policy_loss, pstats = clipped_policy_loss(
                logp, old_logp, advantages[rows], mask,
                algo.clip_eps_low, algo.clip_eps_high, algo.loss_agg,
                token_weights=token_weights,
            )  # fmt: skip
        loss = policy_loss
        stats: dict[str, Any] = {
            K.POLICY_CLIP_FRAC: float(pstats.clip_frac),
            K.POLICY_RATIO_MAX: float(pstats.ratio_max),
        }

        entropy = aggregate(entropy_from_logits(out.logits), mask, algo.loss_agg)
        stats[K.POLICY_ENTROPY] = entropy.item()
        if entropy_coef > 0:
            loss = loss - entropy_coef * entropy
        if data.ref_logp is not None:
            kl = aggregate(kl_k3(logp, data.ref_logp[rows]), mask, algo.loss_agg)
            loss = loss + algo.kl_coef * kl
            stats[K.POLICY_KL_REF] = kl.item()
        if algo.name == "ppo":
            v_loss = value_loss(
                out.values, data.old_values[rows], returns[rows], mask, algo.value_clip
            )
            loss = loss + algo.value_coef * v_loss
            stats[K.VALUE_LOSS] = v_loss.item()
        # Balance losses (aux, z, router KL) on the routers; kept apart for surgery.
        routing_loss, lb_stats = stabilizers.routing_loss(out.routing, data.attention_mask[rows])
        stats.update(lb_stats)

        self.optimizer.zero_grad(set_to_none=True)
        stats.update(stabilizers.backward(loss, routing_loss))
        stabilizers.clip_experts()  # each expert on its own, before the global clip
        params = [p for p in self.policy.parameters() if p.grad is not None]
        max_norm = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        total_loss = loss + routing_loss.detach()
        finite = bool(torch.isfinite(total_loss)) and bool(torch.isfinite(grad_norm))
        if finite:
            self.optimizer.step()
        else:
            # Never let a non-finite update corrupt the weights; the collapse
            # detector records the step.
            self.optimizer.zero_grad(set_to_none=True)
        stats[K.POLICY_LOSS] = policy_loss.item()
        stats[K.POLICY_GRAD_NORM] = grad_norm.item()
        stats["_finite"] = finite
        return stats

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "reward_normalizer": self.reward_normalizer.state_dict(),
            "stabilizers": self.stabilizers.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.reward_normalizer.load_state_dict(state["reward_normalizer"])
        self.stabilizers.load_state_dict(state["stabilizers"])


def _last_true_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last True per row of a (B, T) mask (0 for an all-False row)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask, positions, torch.zeros_like(positions)).max(dim=1).values
