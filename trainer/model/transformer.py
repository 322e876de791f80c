"""Decoder-only transformer LM (nanoGPT layout, pre-norm) with dense or MoE FFNs.

    x = embed(tokens) [+ learned positions]
    for each block:  x = x + attn(norm(x));  x = x + ffn(norm(x))
    logits = head(norm(x))            fp32, (B, T, V)
    values = value_head(norm(x))      PPO critic, (B, T), optional

Batch layout and positions: docs/trainer-internals.md (left padding; position
ids from the attention mask). The Hugging Face families this layout expresses
(GQA, q/k norm, biases, shared-expert gate, dense blocks): docs/models.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.config import ModelConfig
from trainer.model.layers import (
    CausalSelfAttention,
    KVCache,
    RMSNorm,
    SwiGLU,
    attention_bias_mask,
    dynamic_rope_length,
    init_normal_,
    positions_from_mask,
    residual_std,
    rope_frequencies,
    rotary_cos_sin,
)
from trainer.model.mla import MultiLatentAttention
from trainer.model.moe import LayerRouting, MoELayer


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, T, V) fp32; (N, V) at ``logit_positions`` when asked
    values: torch.Tensor | None = None  # (B, T) fp32, value head only
    routing: list[LayerRouting] | None = None  # one per MoE layer, when asked


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int = 0):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn: nn.Module
        if cfg.mla.enabled:
            self.attn = MultiLatentAttention(cfg)
        else:
            self.attn = CausalSelfAttention(
                cfg.d_model,
                cfg.n_heads,
                n_kv_heads=cfg.n_kv_heads,
                head_dim=cfg.head_dim,
                qk_norm=cfg.qk_norm,
                bias=cfg.attention_bias,
                norm_eps=cfg.norm_eps,
                sinks=cfg.attention_sinks,
            )
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        if cfg.is_moe_block(index):
            self.ffn: nn.Module = MoELayer(
                cfg.d_model,
                cfg.n_experts,
                cfg.top_k,
                cfg.expert_hidden,
                cfg.shared_expert_hidden,
                norm_topk_prob=cfg.norm_topk_prob,
                shared_expert_gate=cfg.shared_expert_gate,
                router=cfg.router,
                expert_ffn=cfg.expert_ffn,
            )
        else:
            self.ffn = SwiGLU(cfg.d_model, cfg.resolved_dense_hidden)

    @property
    def is_moe(self) -> bool:
        return isinstance(self.ffn, MoELayer)

    def forward(self, x, mask4d, rope, kv_cache, layer, override, override_mask, return_routing):
        x = x + self.attn(self.attn_norm(x), mask4d, rope, kv_cache, layer)
        h = self.ffn_norm(x)
        if self.is_moe:
            y, routing = self.ffn(h, override, override_mask, return_routing)
        else:
            y, routing = self.ffn(h), None
        return x + y, routing


class TransformerLM(nn.Module):
    """``TransformerLM(cfg.model, vocab_size, value_head=False)``."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, value_head: bool = False):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.pos_emb = (
            nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.positional == "learned" else None
        )
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm_f = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.value_head = nn.Linear(cfg.d_model, 1) if value_head else None
        if cfg.positional == "rope":
            inv_freq, self.rope_scale = rope_frequencies(
                cfg.resolved_rotary_dim, cfg.rope_theta, cfg.rope_scaling
            )
            self.register_buffer("rope_inv_freq", inv_freq, persistent=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        init_normal_(self, std, residual_std(std, self.cfg.n_layers))
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, param in self.named_parameters():
            if name.endswith((".experts.b_gate", ".experts.b_up", ".experts.b_down")):
                nn.init.zeros_(param)  # (E, H) biases: 2-D, but biases start at 0

    # ------------------------------------------------------------------ MoE access
    @property
    def moe_layers(self) -> list[MoELayer]:
        return [block.ffn for block in self.blocks if block.is_moe]

    def set_moe_layer(self, kind: str) -> None:
        """``run.moe_layer`` for every MoE layer: auto | fused | reference
        (trainer.model.moe_fused)."""
        for layer in self.moe_layers:
            layer.layer_kind = kind

    def set_router_temperature(self, temperature: float) -> None:
        for layer in self.moe_layers:
            layer.router.temperature.fill_(temperature)

    def enable_noisy_gating(self, init_std: float, generator: torch.Generator | None) -> None:
        """Noisy top-k selection in every router (training mode only; ``Router.enable_noise``)."""
        for layer in self.moe_layers:
            layer.router.enable_noise(init_std, generator)

    def _checkpoint_blocks(self, kv_cache: KVCache | None) -> bool:
        """Recompute blocks in backward (``model.activation_checkpointing``) when
        training with gradients; never for cached (inference) decoding."""
        return (
            self.cfg.activation_checkpointing
            and kv_cache is None
            and self.training
            and torch.is_grad_enabled()
        )

    def _inv_freq_for(self, positions: torch.Tensor) -> torch.Tensor:
        """The rotary frequencies for these positions: fixed, except dynamic NTK
        scaling past its context (recomputed for max position + 1)."""
        seq_len = dynamic_rope_length(positions, self.cfg.rope_scaling)
        if seq_len is None:
            return self.rope_inv_freq
        inv_freq, _ = rope_frequencies(
            self.cfg.resolved_rotary_dim, self.cfg.rope_theta, self.cfg.rope_scaling, seq_len
        )
        return inv_freq.to(positions.device)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        routing_override: list[torch.Tensor] | None = None,
        override_mask: list[torch.Tensor] | None = None,
        return_routing: bool = False,
        kv_cache: KVCache | None = None,
        logit_positions: torch.Tensor | None = None,
    ) -> ModelOutput:
        """tokens, attention_mask: (B, T). With ``kv_cache`` the tokens are
        appended after the cached ones (incremental decoding). ``logit_positions``:
        (B, T) bool, apply the LM head there only: ``logits`` is then (N, V), one
        row per True entry in row-major order (trainer.algorithms.logprobs)."""
        t = tokens.shape[1]
        if attention_mask is None:
            attention_mask = torch.ones_like(tokens, dtype=torch.bool)
        attention_mask = attention_mask.bool()
        n_moe = len(self.moe_layers)
        if routing_override is not None and len(routing_override) != n_moe:
            raise ValueError(f"routing_override needs one entry per MoE layer ({n_moe})")

        offset = kv_cache.n_real if kv_cache is not None else None
        positions = positions_from_mask(attention_mask, offset)
        key_valid = attention_mask
        if kv_cache is not None:
            if kv_cache.mask is not None:
                key_valid = torch.cat((kv_cache.mask, attention_mask), dim=1)
            kv_cache.mask = key_valid
        mask4d = attention_bias_mask(key_valid, t)
        window = self.cfg.sliding_window
        slide4d = attention_bias_mask(key_valid, t, window) if window is not None else None

        x = self.tok_emb(tokens)
        rope = None
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        else:
            rope = rotary_cos_sin(positions, self._inv_freq_for(positions), self.rope_scale)

        routings: list[LayerRouting] = []
        moe_i = 0
        for i, block in enumerate(self.blocks):
            override = mask_i = None
            if block.is_moe:
                if routing_override is not None:
                    override = routing_override[moe_i]
                    mask_i = override_mask[moe_i] if override_mask is not None else None
                moe_i += 1
            mask_b = slide4d if self.cfg.uses_sliding_window(i) else mask4d
            args = (x, mask_b, rope, kv_cache, i, override, mask_i, return_routing)
            if self._checkpoint_blocks(kv_cache):
                x, routing = _checkpointed_block(block, *args)
            else:
                x, routing = block(*args)
            if routing is not None:
                routings.append(routing)

        h = self.norm_f(x)
        logits = self.lm_head(h if logit_positions is None else h[logit_positions]).float()
        values = self.value_head(h).squeeze(-1).float() if self.value_head is not None else None
        return ModelOutput(
            logits=logits, values=values, routing=routings if return_routing else None
        )


def _checkpointed_block(block: Block, *args):
    """``block(*args)`` under activation checkpointing (torch non-reentrant).

    The recompute in backward must draw the same router noise as the forward
    did: torch restores the global RNG but not a router's own noise
    generator, so its state is replayed here, then put back so the recompute
    does not disturb the draws of later steps.
    """
    router = block.ffn.router if block.is_moe else None
    generator = None if router is None or router.noise is None else router.noise_generator
    if generator is None:
        return checkpoint(block, *args, use_reentrant=False)
    start = generator.get_state()
    calls = 0

    def run(*inner):
        nonlocal calls
        recompute = calls > 0
        calls += 1
        if not recompute:
            return block(*inner)
        after = generator.get_state()
        generator.set_state(start)
        try:
            return block(*inner)
        finally:
            generator.set_state(after)

    return checkpoint(run, *args, use_reentrant=False)
