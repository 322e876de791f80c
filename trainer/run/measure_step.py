"""Stage 3 of the RL step: ONE training forward over the rollout's tokens, no grad.

``measure_batch`` yields the old log-probs the clipped objective needs, the
reference and value outputs, and the training-inference mismatch the study is
about: the rollout engine's log-probs and routing against the training
engine's (formulas: ``trainer.algorithms.measure``), reduced over every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer import metric_keys as K
from trainer.algorithms.logprobs import head_positions, packed_logprobs, scaled
from trainer.algorithms.losses import (
    gather_logprobs,
)
from trainer.algorithms.measure import (
    estimator_stats,
    expert_stats,
    mismatch_stats,
    routing_mismatch,
)
from trainer.config import ExperimentConfig
from trainer.distributed import (
    DistContext,
)
from trainer.model import TransformerLM
from trainer.rollout.data import RolloutData

if TYPE_CHECKING:
    from trainer.run.update import PolicyUpdater


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
    dist = updater.dist
    override, override_mask = stabilizers.routing_for_measure(data)
    # optim.logprobs=response: the LM head only where a response token's log-prob needs it
    positions = (
        head_positions(data.response_mask, entropy=False)
        if cfg.optim.logprobs == "response"
        else None
    )
    out = policy(
        data.tokens,
        attention_mask=data.attention_mask,
        routing_override=override,
        override_mask=override_mask,
        return_routing=is_moe,
        logit_positions=positions,
    )
    # The engine's log-probs are of its sampling distribution (logits / T): compare like with like.
    data.old_logp = _logprobs(out.logits, data.tokens, positions, cfg.rollout.temperature)
    data.old_values = out.values
    metrics: dict[str, Any] = _global_mismatch(
        mismatch_stats(data.old_logp, data.rollout_logp, data.response_mask),
        data.response_mask,
        dist,
    )
    estimator, largest = estimator_stats(
        data.old_logp,
        data.rollout_logp,
        data.response_mask,
        sum_ranks=dist.sum if dist.enabled else None,
    )
    metrics.update(estimator)
    metrics.update(dist.maxima({K.IS_SEQ_LOG_RATIO_MAX: largest}))

    if is_moe and out.routing is not None:
        data.old_routing = [r.natural_indices for r in out.routing]
        stabilizers.observe(out.routing, data.attention_mask)
        seen = data.attention_mask
        if data.rollout_routing is not None:
            seen = seen & data.routing_mask
            # Natural choice of the training router vs the engine: the gap itself,
            # measured even when replay hides it from training.
            natural = _global_routing_mismatch(
                routing_mismatch(data.old_routing, data.rollout_routing, seen), seen, dist
            )
            metrics.update(natural)
            # Without replay the layers used their natural choice: the same number, not recomputed.
            effective = natural
            if override is not None:
                effective = _global_routing_mismatch(
                    routing_mismatch(
                        [r.used_indices for r in out.routing], data.rollout_routing, seen
                    ),
                    seen,
                    dist,
                )
            metrics[K.MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY] = effective[
                K.MISMATCH_ROUTING_INCONSISTENCY
            ]
        metrics.update(
            expert_stats(
                out.routing,
                data.attention_mask,
                cfg.model.n_experts,
                sum_ranks=dist.sum if dist.enabled else None,
                layer_ids=cfg.model.moe_block_indices,
            )
        )
        metrics[K.ROUTER_TEMPERATURE] = float(policy.moe_layers[0].router.temperature)
        if data.routing_bytes_per_token_layer is not None:
            metrics[K.R3_BYTES_PER_TOKEN_LAYER] = float(data.routing_bytes_per_token_layer)

    if updater.reference is not None:
        ref_out = updater.reference(
            data.tokens,
            attention_mask=data.attention_mask,
            routing_override=override,
            override_mask=override_mask,
            logit_positions=positions,
        )
        data.ref_logp = _logprobs(ref_out.logits, data.tokens, positions, cfg.rollout.temperature)
    return metrics


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, positions, temperature: float):
    """(B, T) log-probs of the tokens: from logits packed at ``positions``
    (trainer.algorithms.logprobs), or from (B, T, V) logits when it is None."""
    if positions is None:
        return gather_logprobs(scaled(logits, temperature), tokens)
    return packed_logprobs(logits, tokens, positions, temperature)[0]


def _global_mismatch(local: dict[str, float], mask: torch.Tensor, dist: DistContext):
    """``mismatch_stats`` over every rank's tokens: token means weighted by token
    counts, the per-sequence maximum as a maximum."""
    if not dist.enabled:
        return dict(local)
    n_tok = float(mask.sum())
    out = dist.weighted_means(
        {key: (value, n_tok) for key, value in local.items() if key != K.MISMATCH_KL_K3_MAX}
    )
    out.update(dist.maxima({K.MISMATCH_KL_K3_MAX: local[K.MISMATCH_KL_K3_MAX]}))
    return out


def _global_routing_mismatch(local: dict[str, float], seen: torch.Tensor, dist: DistContext):
    """``routing_mismatch`` over every rank's tokens (SDI: over every rank's sequences)."""
    if not dist.enabled:
        return local
    n_tok, n_seq = float(seen.sum()), float(seen.any(dim=-1).sum())
    return dist.weighted_means(
        {key: (value, n_seq if key == K.MISMATCH_SDI else n_tok) for key, value in local.items()}
    )
