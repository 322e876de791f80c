"""The rollout engine's weights: its own layout of the training model's ``state_dict()``.

Each RL step the engine takes the training weights, rounds them once to its
precision (``trainer.rollout.numerics``) and re-lays them out: attention's
q, k, v in one matrix, the experts' gate and up projections fused on the last
dim for one grouped matmul. Under fp8 with native GEMMs the projection and
expert weights are e4m3 in the layout torch's scaled GEMMs read
(``trainer.rollout.fp8``: ``Fp8Weight``, ``Fp8Experts``); the shape comments
below give the logical shapes. ``EngineLayer`` holds one block; ``EngineWeights``
is the engine's loading half (mixed into ``RolloutEngine``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.config import ModelConfig
from trainer.rollout.fp8 import Fp8Experts, Fp8Weight
from trainer.rollout.mla import MlaWeights, load_mla
from trainer.rollout.numerics import Numerics

# A projection's weight: a tensor, or e4m3 data and scale under native fp8.
Proj = torch.Tensor | Fp8Weight
Experts = torch.Tensor | Fp8Experts


@dataclass
class EngineLayer:
    """One transformer block in the engine's layout and precision (shapes per field)."""

    attn_norm: torch.Tensor
    wqkv: Proj | None  # ((H + 2 Hkv) hd, D): queries, keys, values (None: latent attention)
    wo: Proj  # (D, H hd), or (D, H d_v) after latent attention
    ffn_norm: torch.Tensor
    mla: MlaWeights | None = None  # latent attention (trainer.rollout.mla)
    sinks: torch.Tensor | None = None  # (H,) fp32 attention sink logits (GPT-OSS)
    # Hugging Face attention features (docs/models.md); None when absent
    qkv_bias: torch.Tensor | None = None  # ((H + 2 Hkv) hd,)
    wo_bias: torch.Tensor | None = None  # (D,)
    q_norm: torch.Tensor | None = None  # (hd,) or (H hd,) per cfg.qk_norm
    k_norm: torch.Tensor | None = None  # (hd,) or (Hkv hd,)
    # dense FFN
    w_gate: Proj | None = None  # (H, D)
    w_up: Proj | None = None  # (H, D)
    w_down: Proj | None = None  # (D, H)
    # MoE
    router: torch.Tensor | None = None  # (E, D)
    router_bias: torch.Tensor | None = None  # (E,) fp32 logit bias (GPT-OSS)
    selection_bias: torch.Tensor | None = None  # (E,) fp32
    router_temperature: float = 1.0
    experts_gate_up: Experts | None = None  # (E, D, 2H) fused for one grouped matmul
    experts_down: Experts | None = None  # (E, H, D)
    experts_gate_up_bias: torch.Tensor | None = None  # (E, 2H) (GPT-OSS)
    experts_down_bias: torch.Tensor | None = None  # (E, D)
    shared_gate: Proj | None = None
    shared_up: Proj | None = None
    shared_down: Proj | None = None
    shared_expert_gate: torch.Tensor | None = None  # (1, D): sigmoid gate of the shared expert
    # Precomputed at load so the per-token router skips exact no-ops
    # (x / 1.0 and x + 0.0 change no value and no top-k order).
    has_temperature: bool = False
    has_selection_bias: bool = False
    moe_index: int = -1  # position among the MoE layers (router noise, routing buffers)

    @property
    def is_moe(self) -> bool:
        return self.router is not None


class EngineWeights:
    """The engine's weights in its own layout and storage precision: embeddings,
    ``layers`` (``EngineLayer``), the final norm and the head; empty until the first
    ``load``. One part of ``RolloutEngine``; its forward (``EngineForward``) reads them.

    Under expert parallelism (``trainer.model.expert_parallel``) ``expert_shard``
    names the experts this rank holds; ``load`` then takes those slices.
    """

    def __init__(self, cfg: ModelConfig, num: Numerics):
        self.cfg = cfg
        self.num = num
        self.device = num.device
        self.tok_emb: torch.Tensor | None = None
        self.pos_emb: torch.Tensor | None = None
        self.norm_f: torch.Tensor | None = None
        self.lm_head: torch.Tensor | None = None
        self.layers: list[EngineLayer] = []
        self.loaded = False
        self.expert_shard = None

    @torch.no_grad()
    def load(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Take the training model's ``state_dict()``: round once to this
        engine's precision and re-lay out (fuse the experts' gate|up)."""
        w = self.num.weight
        sd = state_dict

        def g(key: str):  # a projection GEMM's weight (e4m3 under fp8)
            return self.num.gemm_weight(sd[key], key)

        self.tok_emb = w(sd["tok_emb.weight"])
        self.pos_emb = w(sd["pos_emb.weight"]) if self.cfg.positional == "learned" else None
        self.norm_f = w(sd["norm_f.weight"])
        head = sd["tok_emb.weight"] if self.cfg.tie_embeddings else sd["lm_head.weight"]
        self.lm_head = w(head)
        previous, self.layers = self.layers, []
        for i in range(self.cfg.n_layers):
            p = f"blocks.{i}."
            latent = self.cfg.mla.enabled
            layer = EngineLayer(
                attn_norm=w(sd[p + "attn_norm.weight"]),
                wqkv=None if latent else g(p + "attn.qkv.weight"),
                wo=g(p + "attn.proj.weight"),
                ffn_norm=w(sd[p + "ffn_norm.weight"]),
                mla=load_mla(self, sd, p + "attn.") if latent else None,
            )
            self._load_attention_extras(layer, sd, p)
            if p + "ffn.router.weight" in sd:
                layer.moe_index = sum(prev.is_moe for prev in self.layers)
                layer.router = w(sd[p + "ffn.router.weight"])
                if p + "ffn.router.bias" in sd:
                    layer.router_bias = sd[p + "ffn.router.bias"].to(self.device, torch.float32)
                layer.selection_bias = sd[p + "ffn.router.selection_bias"].to(
                    self.device, torch.float32
                )
                layer.router_temperature = float(sd[p + "ffn.router.temperature"])
                layer.has_temperature = layer.router_temperature != 1.0
                layer.has_selection_bias = bool(layer.selection_bias.any())
                gate, up = sd[p + "ffn.experts.w_gate"], sd[p + "ffn.experts.w_up"]
                if self.num.fp8:
                    # One fp8 scale per expert for gate and for up (two checkpoint tensors),
                    # then fused.
                    gate_up = p + "ffn.experts.w_gate|w_up"
                    layer.experts_gate_up = self.num.expert_weights(gate_up, gate, up)
                    down = p + "ffn.experts.w_down"
                    layer.experts_down = self.num.expert_weights(down, sd[down])
                else:
                    layer.experts_gate_up = self._fused_gate_up(
                        previous[i].experts_gate_up if i < len(previous) else None, gate, up
                    )
                    layer.experts_down = w(sd[p + "ffn.experts.w_down"])
                if p + "ffn.experts.b_gate" in sd:
                    biases = (sd[p + f"ffn.experts.b_{n}"] for n in ("gate", "up"))
                    layer.experts_gate_up_bias = w(torch.cat(tuple(biases), dim=-1))
                    layer.experts_down_bias = w(sd[p + "ffn.experts.b_down"])
                if p + "ffn.shared.w_gate.weight" in sd:
                    layer.shared_gate = g(p + "ffn.shared.w_gate.weight")
                    layer.shared_up = g(p + "ffn.shared.w_up.weight")
                    layer.shared_down = g(p + "ffn.shared.w_down.weight")
                if p + "ffn.shared_gate.weight" in sd:
                    layer.shared_expert_gate = w(sd[p + "ffn.shared_gate.weight"])
            else:
                layer.w_gate = g(p + "ffn.w_gate.weight")
                layer.w_up = g(p + "ffn.w_up.weight")
                layer.w_down = g(p + "ffn.w_down.weight")
            self.layers.append(layer)
        self.loaded = True

    def _fused_gate_up(
        self, buffer: torch.Tensor | None, gate: torch.Tensor, up: torch.Tensor
    ) -> torch.Tensor:
        """The experts' gate|up weights fused on the last dim, ``(E, D, 2H)``, in the
        engine's storage. The previous sync's buffer is refilled in place when it
        fits: no new (E, D, 2H) allocation and no fp32 temporary per step, only
        the copy (and rounding) the precision needs. The bits equal
        ``weight(cat(gate, up))``: emulated half rounds through a half-size
        temporary exactly as ``Numerics.round`` does."""
        e, d, h = gate.shape
        num = self.num
        if buffer is None or buffer.shape != (e, d, 2 * h) or buffer.dtype != num.dtype:
            buffer = torch.empty(e, d, 2 * h, dtype=num.dtype, device=self.device)
        for half, src in ((buffer[..., :h], gate), (buffer[..., h:], up)):
            src = src.detach()
            half.copy_(src.to(num.half) if num.emulated else src)
        return buffer

    def _load_attention_extras(
        self, layer: EngineLayer, sd: dict[str, torch.Tensor], p: str
    ) -> None:
        """Biases, q/k norms and sinks of the Hugging Face families (absent in the builtin
        model unless configured)."""
        w = self.num.weight
        get = sd.get
        if get(p + "attn.qkv.bias") is not None:
            layer.qkv_bias = w(sd[p + "attn.qkv.bias"])
        if get(p + "attn.proj.bias") is not None:
            layer.wo_bias = w(sd[p + "attn.proj.bias"])
        if get(p + "attn.q_norm.weight") is not None:
            layer.q_norm = w(sd[p + "attn.q_norm.weight"])
            layer.k_norm = w(sd[p + "attn.k_norm.weight"])
        if get(p + "attn.sinks") is not None:
            layer.sinks = sd[p + "attn.sinks"].detach().to(self.device, torch.float32)
