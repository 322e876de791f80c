"""Mixture-of-Experts FFN: a linear top-k router over SwiGLU experts.

Routing (``trainer.model.routing`` holds every formula; Mixtral / Qwen3 by default):

    logits  = (x W_r^T [+ b_r]) / temperature     fp32, also under autocast
    scores  = softmax(logits) | sigmoid(logits)   ``model.router.score``
    natural = top-k of the choice scores          logits + selection_bias (softmax) or
                                                  sigmoid + selection_bias (sigmoid), within
                                                  the best groups when grouped (DeepSeek)
    used    = override where replaying, else natural
    gates   = scores[used] / sum(scores[used])    renormalised over the used experts
              (norm_topk_prob; without it gates = scores[used], Qwen2-MoE / OLMoE),
              times ``router.scaling`` (DeepSeek-V3's routed_scaling_factor)

Mixtral's "top-k of the logits, then softmax over the selected" equals the
renormalised form: softmax restricted to a subset S is exp(l_i)/sum_S exp(l_j)
= p_i / sum_S p_j (the full normaliser cancels), and top-k of the logits and
of the probabilities pick the same set (softmax is monotonic).

Gates are always gathered from the FULL scores of the training logits, never
from top-k-zeroed probabilities, so under routing replay (R3, arXiv
2510.11370) the router still gets a gradient through the gates; the selection
bias moves the choice, never a gate.

Hooks for balancing stabilizers: ``Router.selection_bias`` is added to the
choice scores for SELECTION only (auxiliary-loss-free balancing, Wang et al.
2024, arXiv 2408.15664; DeepSeek-V3's ``e_score_correction_bias``, arXiv
2412.19437), and ``Router.selection_scores`` is the one place where noisy
top-k gating (Shazeer et al. 2017) adds its noise: only once
``enable_noise`` was called, only in training mode, and only to the scores
the top-k ranks (never to the probabilities the gates are gathered from).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ExpertFfnConfig, RouterConfig
from trainer.model.dispatch import Dispatch, expert_ffn, experts_swiglu, resolve_backend
from trainer.model.expert_parallel import ExpertShard, ep_experts_swiglu
from trainer.model.layers import SwiGLU
from trainer.model.moe_fused import choose_moe_layer, experts_swiglu_fused
from trainer.model.noisy_gating import NoiseScale, noisy_topk_logits
from trainer.model.routing import (
    affinities,
    choice_scores,
    distribution,
    gate_weights,
    select_experts,
    topk_gates,
)

__all__ = ["ExpertWeights", "LayerRouting", "MoELayer", "Router", "topk_gates"]


@dataclass
class LayerRouting:
    """One MoE layer's routing for a batch; all fp32/int64 and (B, T, ...).

    logits: (B, T, E) router logits after temperature
    probs: (B, T, E) the router's distribution over experts: the softmax, or a sigmoid
        router's affinities normalised to sum 1 (``trainer.model.routing.distribution``)
    natural_indices: (B, T, k) the router's own top-k
    used_indices: (B, T, k) experts actually used (override where given)
    gates: (B, T, k) weights of used_indices (``trainer.model.routing.gate_weights``)
    """

    logits: torch.Tensor
    probs: torch.Tensor
    natural_indices: torch.Tensor
    used_indices: torch.Tensor
    gates: torch.Tensor


class Router(nn.Module):
    """Linear router; logits and scores in fp32 regardless of autocast. ``cfg`` (a
    ``RouterConfig``, None = the default softmax router): score function, logit bias,
    groups and gate scaling."""

    def __init__(self, d_model: int, n_experts: int, top_k: int, cfg: RouterConfig | None = None):
        super().__init__()
        self.n_experts = n_experts
        self.top_k = top_k
        self.cfg = cfg or RouterConfig()
        self.weight = nn.Parameter(torch.empty(n_experts, d_model))
        # GPT-OSS's learned logit bias (a parameter, trained), not the selection bias.
        self.bias = nn.Parameter(torch.zeros(n_experts)) if self.cfg.bias else None
        # Persistent so checkpoints and the rollout engine's weight sync carry them.
        self.register_buffer("selection_bias", torch.zeros(n_experts))
        self.register_buffer("temperature", torch.ones(()))
        # Noisy top-k gating, off until ``enable_noise``.
        self.noise: NoiseScale | None = None
        self.noise_generator: torch.Generator | None = None

    def enable_noise(self, init_std: float, generator: torch.Generator | None = None) -> None:
        """Add a learned softplus noise scale (E,) to the selection scores in training.

        ``generator`` draws the noise (deterministic runs keep it in the checkpoint).
        The scale is a parameter (``noise.raw``) but, used for selection only, it
        receives no gradient and stays at ``init_std`` (trainer.model.noisy_gating).
        """
        self.noise = NoiseScale(self.n_experts, init_std).to(self.weight.device)
        self.noise_generator = generator

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: (N, D) -> (N, E) fp32 logits / temperature."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return F.linear(x.float(), self.weight.float(), bias) / self.temperature

    def selection_scores(self, logits: torch.Tensor) -> torch.Tensor:
        """Scores the top-k selection ranks (``routing.choice_scores``): the per-expert
        bias added (selection only), plus Gaussian noise of the learned scale in
        training mode when noise is enabled."""
        perturb = None
        if self.noise is not None and self.training:

            def perturb(scores: torch.Tensor) -> torch.Tensor:
                return noisy_topk_logits(scores, self.noise(), self.noise_generator)

        return choice_scores(logits, self.selection_bias, self.cfg.score, perturb)

    def forward(self, x: torch.Tensor):
        """x: (N, D) -> logits (N, E), scores (N, E) (the affinities gates come from:
        softmax or sigmoid), natural top-k indices (N, k)."""
        logits = self.logits(x)
        scores = affinities(logits, self.cfg.score)
        cfg = self.cfg
        natural = select_experts(
            self.selection_scores(logits),
            self.top_k,
            cfg.n_groups,
            cfg.topk_groups,
            cfg.group_score,
        )
        return logits, scores, natural


class ExpertWeights(nn.Module):
    """Stacked SwiGLU expert weights laid out for ``x @ w``.

    w_gate, w_up: (E, D, H); w_down: (E, H, D). Expert e's parameters are the
    slices ``[e]`` (per-expert gradient clipping uses that).
    """

    def __init__(
        self,
        n_experts: int,
        d_model: int,
        hidden: int,
        backend: str = "auto",
        ffn: ExpertFfnConfig | None = None,
    ):
        super().__init__()
        self.w_gate = nn.Parameter(torch.empty(n_experts, d_model, hidden))
        self.w_up = nn.Parameter(torch.empty(n_experts, d_model, hidden))
        self.w_down = nn.Parameter(torch.empty(n_experts, hidden, d_model))
        self.backend = backend  # "auto" | "grouped_mm" | "loop" (trainer.model.dispatch)
        # GPT-OSS: per-expert biases (E, H), (E, H), (E, D) and the clamped SwiGLU.
        self.ffn = ffn if ffn is not None and ffn != ExpertFfnConfig() else None
        self.b_gate = self.b_up = self.b_down = None
        if self.ffn is not None and self.ffn.bias:
            self.b_gate = nn.Parameter(torch.zeros(n_experts, hidden))
            self.b_up = nn.Parameter(torch.zeros(n_experts, hidden))
            self.b_down = nn.Parameter(torch.zeros(n_experts, d_model))

    @property
    def biases(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        return None if self.b_gate is None else (self.b_gate, self.b_up, self.b_down)

    def forward(self, xs: torch.Tensor, dispatch: Dispatch) -> torch.Tensor:
        """The SwiGLU of each row's expert: xs (M, D) grouped by expert
        (``dispatch.counts``: (E,) rows per expert of this module) -> (M, D).

        Expert parallelism calls it on the rows that arrived from the group, so
        that an FSDP unit around this module gathers the expert weights around
        exactly this computation (trainer.distributed.shard_model)."""
        kind = resolve_backend(self.backend, xs)
        return expert_ffn(
            xs, dispatch, self.w_gate, self.w_up, self.w_down, kind, self.biases, self.ffn
        )


class MoELayer(nn.Module):
    """Top-k routed SwiGLU experts plus an optional always-on shared expert.

    ``shared_expert_gate`` scales the shared expert per token by
    sigmoid(x w_g), w_g (1, D) (Qwen2-MoE's ``shared_expert_gate``); without the
    gate the shared expert is always added (DeepSeek's shared experts). ``router``
    and ``expert_ffn``: the routing and expert features of ``trainer.config.model_parts``.
    """

    def __init__(
        self,
        d_model: int,
        n_experts: int,
        top_k: int,
        expert_hidden: int,
        shared_expert_hidden: int = 0,
        backend: str = "auto",
        norm_topk_prob: bool = True,
        shared_expert_gate: bool = False,
        router: RouterConfig | None = None,
        expert_ffn: ExpertFfnConfig | None = None,
    ):
        super().__init__()
        self.n_experts = n_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.router = Router(d_model, n_experts, top_k, router)
        self.experts = ExpertWeights(n_experts, d_model, expert_hidden, backend, expert_ffn)
        self.shared = SwiGLU(d_model, shared_expert_hidden) if shared_expert_hidden else None
        self.shared_gate = nn.Linear(d_model, 1, bias=False) if shared_expert_gate else None
        # Set by expert_parallel.shard_experts_: this rank holds a slice of the experts
        # and the forward sends tokens to their experts' rank and back.
        self.expert_shard: ExpertShard | None = None
        # run.moe_layer: "auto" (fused on CUDA), "fused" or "reference" (moe_fused.py)
        self.layer_kind = "auto"

    def fused_on(self, device_type: str) -> bool:
        """Whether the fused experts (trainer.model.moe_fused) run on this device."""
        return choose_moe_layer(self.layer_kind, device_type) == "fused"

    def forward(
        self,
        x: torch.Tensor,
        routing_override: torch.Tensor | None = None,
        override_mask: torch.Tensor | None = None,
        return_routing: bool = False,
    ) -> tuple[torch.Tensor, LayerRouting | None]:
        """x: (B, T, D); routing_override: (B, T, k) expert ids to replay;
        override_mask: (B, T) True = use the override there (default: everywhere).
        Returns y (B, T, D) and the LayerRouting when ``return_routing``.
        """
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        logits, scores, natural = self.router(flat)
        score_kind = self.router.cfg.score
        probs = distribution(scores, score_kind)
        used = natural
        if routing_override is not None:
            override = routing_override.reshape(b * t, self.top_k).to(natural.device)
            if override_mask is not None:
                keep = override_mask.reshape(b * t, 1).to(natural.device)
                override = torch.where(keep, override, natural)
            used = override
        gates = gate_weights(scores, used, self.norm_topk_prob, score_kind, self.router.cfg.scaling)
        e = self.experts
        if self.expert_shard is not None:
            y = ep_experts_swiglu(flat, gates, used, e, self.expert_shard)
        elif e.biases is None and e.ffn is None and self.fused_on(flat.device.type):
            y = experts_swiglu_fused(flat, gates, used, e.w_gate, e.w_up, e.w_down, e.backend)
        else:
            y = experts_swiglu(
                flat, gates, used, e.w_gate, e.w_up, e.w_down, e.backend, e.biases, e.ffn
            )
        if self.shared is not None:
            shared = self.shared(flat)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            y = y + shared
        routing = None
        if return_routing:
            routing = LayerRouting(
                logits=logits.view(b, t, -1),
                probs=probs.view(b, t, -1),
                natural_indices=natural.view(b, t, -1),
                used_indices=used.view(b, t, -1),
                gates=gates.view(b, t, -1),
            )
        return y.view(b, t, d), routing
