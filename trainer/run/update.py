"""Advantages and the off-policy policy update (stages 4 and 5 of the RL step).

After the measurement forward (``trainer.run.measure_step.measure_batch``) has
given the old log-probs, ``PolicyUpdater.update`` takes several minibatch steps
(x epochs) on the same batch, which is the off-policy setting in which MoE
instability shows.

The stabilizers (routing replay, balance losses, surgery, per-expert clipping,
controllers) live in ``trainer.stabilizers.loop.Stabilizers``; this module only
calls them at their places in the forward/backward.
"""

from __future__ import annotations

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
from trainer.algorithms.logprobs import (
    head_positions,
    packed_entropy,
    packed_logprobs,
    scaled,
)
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
from trainer.devices.precision import MasterWeights
from trainer.distributed import (
    SINGLE,
    DistContext,
    shard_model,
    shard_model_experts,
)
from trainer.model import TransformerLM
from trainer.rollout.data import RolloutData
from trainer.stabilizers.loop import Stabilizers, is_expert_param, is_router_param


class PolicyUpdater:
    """Advantages + the clipped-objective update over minibatches and epochs."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        policy: TransformerLM,
        reference: TransformerLM | None,
        shuffle_generator: torch.Generator,
        stabilizers: Stabilizers | None = None,
        dist: DistContext = SINGLE,
    ):
        self.cfg = cfg
        self.policy = policy
        self.reference = reference
        self.shuffle_generator = shuffle_generator
        self.dist = dist
        # Built before the optimiser: noisy gating adds the routers' noise-scale parameters.
        device = next(policy.parameters()).device
        self.stabilizers = stabilizers or Stabilizers(cfg, policy, device, dist)
        # The module the update forwards through: DDP averages gradients in backward;
        # FSDP2 shards the policy (and the frozen reference) in place, so the
        # optimiser below is built on the shards.
        self.train_module: torch.nn.Module = policy
        if dist.ep:
            # Each rank keeps its experts. Without FSDP, gradients are averaged by
            # hand after the backward (average_gradients): DDP would mix different
            # ranks' experts. The frozen reference keeps every expert.
            shard_model_experts(policy, dist)
        if dist.fsdp:
            # optim.param_dtype=bf16 under FSDP: fp32 shards are the masters and
            # each all-gather casts to bf16 (trainer.distributed.shard_model).
            shard_model(policy, dist, cfg.optim.param_dtype)
            if reference is not None:
                shard_model(reference, dist, cfg.optim.param_dtype)
        elif dist.enabled and not dist.ep:
            self.train_module = torch.nn.parallel.DistributedDataParallel(
                policy,
                device_ids=[device.index] if device.type == "cuda" else None,
                # The routers' buffers (bias, temperature) are set from global loads,
                # identical on every rank: nothing to broadcast each forward.
                broadcast_buffers=False,
                # The noise scale selects experts only and never gets a gradient.
                find_unused_parameters=cfg.stabilizers.noisy_gating.enabled,
            )
        # optim.param_dtype=bf16: AdamW steps fp32 masters of the bf16 weights (built
        # after any sharding, so they mirror the parameters this rank holds).
        self.masters = MasterWeights(policy)
        self.optimizer = torch.optim.AdamW(
            self._param_groups(),
            lr=cfg.optim.lr,
            betas=(cfg.optim.beta1, cfg.optim.beta2),
            weight_decay=cfg.optim.weight_decay,
            # The fused kernel (one vectorised pass over each tensor, CPU and CUDA)
            # instead of the per-tensor loop torch defaults to on the CPU: Adam
            # touches every parameter, active or not, so its cost grows with the
            # total, and fused is about 5x cheaper than the loop (CPU time,
            # docs/benchmarks.md).
            # FSDP's sharded DTensor parameters take the multi-tensor path.
            **({"foreach": True} if dist.fsdp else {"fused": True}),
        )
        self.reward_normalizer = RewardNormalizer(decay=cfg.algorithm.advantage.ema_decay)

    def _param_groups(self) -> list[dict[str, Any]]:
        """Expert and router parameters get their own learning-rate multipliers."""
        optim = self.cfg.optim
        groups: dict[str, list[torch.nn.Parameter]] = {"expert": [], "router": [], "other": []}
        for name, param in self.policy.named_parameters():
            if is_router_param(name):
                groups["router"].append(param)
            elif is_expert_param(name):
                groups["expert"].append(param)
            else:
                groups["other"].append(param)
        scale = {"expert": optim.expert_lr_scale, "router": optim.router_lr_scale, "other": 1.0}
        return [
            {
                "params": [self.masters.optimizer_param(p) for p in params],
                "name": name,
                "lr_scale": scale[name],
            }
            for name, params in groups.items()
            if params
        ]

    # -- advantages ------------------------------------------------------------------
    def advantages(self, data: RolloutData) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(advantages, returns): (B,) for GRPO/GSPO, (B, T) for PPO."""
        algo = self.cfg.algorithm
        if algo.spec.advantage == "gae":
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
            mean = self._batch_mean(adv, data.response_mask)
            std = self._batch_mean((adv - mean) ** 2, data.response_mask).sqrt()
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

    def _batch_mean(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Masked mean over the GLOBAL batch (every rank's tokens), a 0-dim tensor."""
        local = masked_mean(x, mask)
        if not self.dist.enabled:
            return local
        mean = self.dist.weighted_means({"m": (float(local), float(mask.sum()))})["m"]
        return torch.tensor(mean, dtype=local.dtype, device=local.device)

    # -- update ----------------------------------------------------------------------
    def update(
        self, data: RolloutData, step: int, *, lr: float, entropy_coef: float
    ) -> dict[str, Any]:
        cfg = self.cfg
        algo = cfg.algorithm
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        advantages, returns = self.advantages(data)
        isc = cfg.stabilizers.is_correction
        weights, is_stats = is_weights(
            data.old_logp,
            data.rollout_logp,
            data.response_mask,
            mode=isc.kind,
            tis_cap=isc.tis_cap,
            mis_low=isc.mis_low,
            mis_high=isc.mis_high,
            icepop_low=isc.icepop_low,
            icepop_high=isc.icepop_high,
        )

        self.policy.train()
        totals: dict[str, list[float]] = {}
        finite = True
        # Minibatches are drawn over the GLOBAL batch (the same permutation on every
        # rank); each rank trains on the rows of each minibatch it holds.
        n = data.global_batch_size
        first, end = data.global_offset, data.global_offset + data.batch_size
        n_mb = min(algo.minibatches, n)
        for _ in range(algo.epochs):
            order = torch.randperm(n, generator=self.shuffle_generator)
            for chunk in order.chunk(n_mb):
                rows = (chunk[(chunk >= first) & (chunk < end)] - first).to(data.tokens.device)
                stats = self._minibatch_step(data, rows, advantages, returns, weights, entropy_coef)
                if not totals:  # the step's first minibatch: no update of this step yet
                    stats[K.POLICY_CLIP_FRAC_FIRST] = stats[K.POLICY_CLIP_FRAC]
                finite &= stats.pop("_finite")
                for key, value in stats.items():
                    totals.setdefault(key, []).append(value)

        metrics = {key: sum(v) / len(v) for key, v in totals.items() if key != K.POLICY_RATIO_MAX}
        if K.POLICY_RATIO_MAX in totals:
            metrics[K.POLICY_RATIO_MAX] = max(totals[K.POLICY_RATIO_MAX])
        if isc.kind != "none":
            n_tok = float(data.response_mask.sum())
            metrics.update(
                self.dist.weighted_means(
                    {
                        K.TIS_CLIP_FRAC: (float(is_stats.clip_frac), n_tok),
                        K.TIS_MASKED_FRAC: (float(is_stats.masked_frac), n_tok),
                        K.TIS_RATIO_MEAN: (float(is_stats.ratio_mean), n_tok),
                    }
                )
            )
            metrics.update(self.dist.maxima({K.TIS_RATIO_MAX: float(is_stats.ratio_max)}))
        metrics["_finite"] = finite
        return metrics

    def _minibatch_step(self, data, rows, advantages, returns, weights, entropy_coef):
        """One optimiser step on this rank's ``rows`` of a global minibatch.

        Every loss term is this rank's local mean times ``n_local * W / n_global``
        (``DistContext.global_scales``): averaged over the ranks by DDP/FSDP it is the
        single-process mean over the global minibatch. A rank without rows runs one
        row with every mask emptied (scale 0), so it still joins the collectives.
        """
        cfg = self.cfg
        algo = cfg.algorithm
        dist = self.dist
        active = rows.numel() > 0
        if not active:
            rows = torch.zeros(1, dtype=torch.long, device=data.tokens.device)
        tokens = data.tokens[rows]
        attention = data.attention_mask[rows]
        mask = data.response_mask[rows]
        loss_attention = attention
        if not active:
            mask, loss_attention = torch.zeros_like(mask), torch.zeros_like(attention)
        n_tok, n_seq = float(mask.sum()), float(mask.any(dim=-1).sum())
        count = {"token_mean": n_tok, "seq_mean": n_seq}
        scale = dict(zip(count, dist.global_scales(list(count.values())), strict=True))
        stabilizers = self.stabilizers
        override, override_mask = stabilizers.routing_for_update(data, rows)
        # optim.logprobs=response: the LM head only at the positions the loss reads
        positions = head_positions(mask, entropy=True) if cfg.optim.logprobs == "response" else None
        out = self.train_module(
            tokens,
            attention_mask=attention,
            routing_override=override,
            override_mask=override_mask,
            return_routing=stabilizers.needs_routing,
            logit_positions=positions,
        )
        logp, entropies = _logprobs_and_entropy(
            out.logits, tokens, positions, cfg.rollout.temperature, grad=entropy_coef > 0
        )
        old_logp = behavior_logp(data, algo.behavior_logprobs)[rows]
        token_weights = weights[rows] if cfg.stabilizers.is_correction.kind != "none" else None
        if algo.spec.ratio == "sequence":
            policy_agg = "seq_mean"
            policy_loss, pstats = gspo_policy_loss(
                logp,
                old_logp,
                advantages[rows],
                mask,
                algo.clip_eps_low,
                algo.clip_eps_high,
                token_weights=token_weights,
            )
        else:
            policy_agg = algo.loss_agg
            policy_loss, pstats = clipped_policy_loss(
                logp,
                old_logp,
                advantages[rows],
                mask,
                algo.clip_eps_low,
                algo.clip_eps_high,
                algo.loss_agg,
                token_weights=token_weights,
            )
        loss = policy_loss * scale[policy_agg]
        # (local mean, weight) of every reported mean; reduced over ranks below.
        means: dict[str, tuple[float, float]] = {
            K.POLICY_LOSS: (policy_loss.item(), count[policy_agg]),
            # Token-ratio clip share over tokens; GSPO's sequence clip share over sequences.
            K.POLICY_CLIP_FRAC: (
                float(pstats.clip_frac),
                count[policy_agg] if algo.spec.ratio == "sequence" else n_tok,
            ),
        }

        # The updated policy's distance from the rollout on this minibatch's tokens
        # (mismatch_stats' k3 with pi_theta in place of pi_old).
        log_r = torch.where(mask, logp.detach() - data.rollout_logp[rows], 0.0)
        means[K.POLICY_ROLLOUT_K3] = (float(masked_mean(torch.expm1(log_r) - log_r, mask)), n_tok)

        entropy = aggregate(entropies, mask, algo.loss_agg)
        means[K.POLICY_ENTROPY] = (entropy.item(), count[algo.loss_agg])
        if entropy_coef > 0:
            loss = loss - entropy_coef * entropy * scale[algo.loss_agg]
        if data.ref_logp is not None:
            kl = aggregate(kl_k3(logp, data.ref_logp[rows]), mask, algo.loss_agg)
            loss = loss + algo.kl_coef * kl * scale[algo.loss_agg]
            means[K.POLICY_KL_REF] = (kl.item(), count[algo.loss_agg])
        if algo.spec.has_value_head:
            v_loss = value_loss(
                out.values, data.old_values[rows], returns[rows], mask, algo.value_clip
            )
            loss = loss + algo.value_coef * v_loss * scale["token_mean"]
            means[K.VALUE_LOSS] = (v_loss.item(), n_tok)
        # Balance losses (aux, z, router KL) on the routers; kept apart for surgery.
        # Over ranks they are already each rank's share of the global loss.
        routing_loss, lb_stats = stabilizers.routing_loss(out.routing, loss_attention)
        stats: dict[str, Any] = dict(lb_stats)
        stats.update(dist.weighted_means(means))
        ratio_max = float(pstats.ratio_max) if active else float("-inf")
        stats[K.POLICY_RATIO_MAX] = dist.maxima({"r": ratio_max})["r"]

        self.optimizer.zero_grad(set_to_none=True)
        self.masters.zero_model_grads()
        stats.update(stabilizers.backward(loss, routing_loss))
        dist.sync_expert_grads(self.policy.named_parameters(), is_expert_param)
        stabilizers.clip_experts()  # each expert on its own, before the global clip
        self.masters.grads_to_masters()  # the global norm and the step in fp32
        # In the model's parameter order (the norm's summation order), masters for bf16.
        stepped = (self.masters.optimizer_param(p) for p in self.policy.parameters())
        params = [p for p in stepped if p.grad is not None]
        max_norm = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        grad_norm = dist.clip_grad_norm_(
            params, max_norm, self.policy.named_parameters(), is_expert_param
        )
        total_loss = loss + routing_loss.detach()
        finite = bool(torch.isfinite(total_loss)) and bool(torch.isfinite(grad_norm))
        # Every rank takes the same decision, or the replicas would drift apart.
        finite = dist.all_true(finite)
        if finite:
            self.optimizer.step()
            self.masters.masters_to_params()
        else:
            # Never let a non-finite update corrupt the weights; the collapse
            # detector records the step.
            self.optimizer.zero_grad(set_to_none=True)
        stats[K.POLICY_GRAD_NORM] = grad_norm.item()
        stats["_finite"] = finite
        return stats

    def state_dict(self) -> dict[str, Any]:
        return {
            # FSDP: the sharded optimiser state goes to torch.distributed.checkpoint.
            # Expert parallelism: each rank's expert states differ (runner gathers them).
            "optimizer": (None if self.dist.fsdp or self.dist.ep else self.optimizer.state_dict()),
            "reward_normalizer": self.reward_normalizer.state_dict(),
            "stabilizers": self.stabilizers.state_dict(),
            "master_weights": self.masters.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.reward_normalizer.load_state_dict(state["reward_normalizer"])
        self.stabilizers.load_state_dict(state["stabilizers"])
        self.masters.load_state_dict(state.get("master_weights"))


def behavior_logp(data: RolloutData, source: str) -> torch.Tensor:
    """The ratio's denominator, (B, T): the one place GRPO, GSPO and PPO take it from.

    ``train``: pi_old recomputed by the training engine before the update
    (``measure_batch``), so ratio = pi_theta / pi_old^train is exactly 1 on the
    first minibatch and the engine gap reaches the update only through which
    tokens were sampled. ``rollout``: the engine's own log-probs, as frameworks
    that skip the recompute do, so ratio = pi_theta / pi_rollout carries the
    gap (its log is the per-token train-rollout log-ratio on the first
    minibatch) and the clip acts on it.
    """
    if source == "rollout":
        return data.rollout_logp
    return data.old_logp


def _last_true_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last True per row of a (B, T) mask (0 for an all-False row)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask, positions, torch.zeros_like(positions)).max(dim=1).values


def _logprobs_and_entropy(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor | None,
    temperature: float,
    grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probs of the tokens under logits / temperature and (B, T) entropies of
    the untempered logits, from (B, T, V) logits or logits packed at ``positions``
    (trainer.algorithms.logprobs: one log-softmax serves both at temperature 1). The
    entropy enters the loss only with an entropy bonus: else it is a metric, computed
    without a graph (``grad``)."""
    if positions is None:
        logp = gather_logprobs(scaled(logits, temperature), tokens)
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            return logp, entropy_from_logits(logits)
    logp, lsm = packed_logprobs(logits, tokens, positions, temperature)
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        if temperature != 1.0:  # the entropy is of the untempered distribution
            lsm = torch.log_softmax(logits.float(), dim=-1)
        return logp, packed_entropy(lsm, positions)
