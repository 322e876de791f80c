"""Decoder-only transformer LM (nanoGPT layout, pre-norm) with dense or MoE FFNs.

    x = embed(tokens) [+ learned positions]
    for each block:  x = x + attn(norm(x));  x = x + ffn(norm(x))
    logits = head(norm(x))            fp32, (B, T, V)
    values = value_head(norm(x))      PPO critic, (B, T), optional

Batch layout and positions: docs/trainer-internals.md (left padding; position
ids from the attention mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainer.config import ModelConfig
from trainer.model.layers import (
    CausalSelfAttention,
    KVCache,
    RMSNorm,
    SwiGLU,
    attention_bias_mask,
    init_normal_,
    positions_from_mask,
    residual_std,
    rotary_cos_sin,
    rotary_inv_freq,
)
from trainer.model.moe import LayerRouting, MoELayer


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, T, V) fp32
    values: torch.Tensor | None = None  # (B, T) fp32, value head only
    routing: list[LayerRouting] | None = None  # one per MoE layer, when asked


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        if cfg.is_moe:
            self.ffn: nn.Module = MoELayer(
                cfg.d_model,
                cfg.n_experts,
                cfg.top_k,
                cfg.expert_hidden,
                cfg.shared_expert_hidden,
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
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.value_head = nn.Linear(cfg.d_model, 1) if value_head else None
        if cfg.positional == "rope":
            self.register_buffer(
                "rope_inv_freq", rotary_inv_freq(cfg.d_model // cfg.n_heads), persistent=False
            )
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        init_normal_(self, std, residual_std(std, self.cfg.n_layers))
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ MoE access
    @property
    def moe_layers(self) -> list[MoELayer]:
        return [block.ffn for block in self.blocks if block.is_moe]

    def set_router_temperature(self, temperature: float) -> None:
        for layer in self.moe_layers:
            layer.router.temperature.fill_(temperature)

    def enable_noisy_gating(self, init_std: float, generator: torch.Generator | None) -> None:
        """Noisy top-k selection in every router (training mode only; ``Router.enable_noise``)."""
        for layer in self.moe_layers:
            layer.router.enable_noise(init_std, generator)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        routing_override: list[torch.Tensor] | None = None,
        override_mask: list[torch.Tensor] | None = None,
        return_routing: bool = False,
        kv_cache: KVCache | None = None,
    ) -> ModelOutput:
        """tokens, attention_mask: (B, T). With ``kv_cache`` the tokens are
        appended after the cached ones (incremental decoding)."""
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

        x = self.tok_emb(tokens)
        rope = None
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        else:
            rope = rotary_cos_sin(positions, self.rope_inv_freq)

        routings: list[LayerRouting] = []
        moe_i = 0
        for i, block in enumerate(self.blocks):
            override = mask_i = None
            if block.is_moe:
                if routing_override is not None:
                    override = routing_override[moe_i]
                    mask_i = override_mask[moe_i] if override_mask is not None else None
                moe_i += 1
            x, routing = block(x, mask4d, rope, kv_cache, i, override, mask_i, return_routing)
            if routing is not None:
                routings.append(routing)

        h = self.norm_f(x)
        logits = self.lm_head(h).float()
        values = self.value_head(h).squeeze(-1).float() if self.value_head is not None else None
        return ModelOutput(
            logits=logits, values=values, routing=routings if return_routing else None
        )
