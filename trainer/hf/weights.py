"""Weight names: the lab's ``state_dict`` <-> a Hugging Face checkpoint's tensors.

One plan serves both directions (``weight_plan``): each ``Piece`` says how one
lab tensor (or one expert's slice of it) is made from checkpoint tensors:

* ``copy``: the same tensor (norms, embeddings, o_proj, routers, ...);
* ``cat``: concatenated along dim 0 (q|k|v -> ``attn.qkv``), split back on export;
* ``expert``: expert ``e``'s slice ``param[e]`` is the transpose of the
  checkpoint's per-expert matrix (the lab stores experts as (E, D, H) / (E, H, D)
  for ``x @ w`` grouped matmuls; HF stores nn.Linear weights (out, in)).

Checkpoints written by transformers 5 in its fused in-memory layout
(``experts.gate_up_proj`` (E, 2H, D), ``experts.down_proj`` (E, D, H)) are
read too (``fused_expert``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import ModelConfig


@dataclass(frozen=True)
class Piece:
    lab: str  # lab state_dict key
    kind: str  # "copy" | "cat" | "expert" | "fused_expert"
    hf: tuple[str, ...]  # checkpoint keys
    expert: int = -1  # expert index for "expert"
    part: str = ""  # fused_expert: "gate" | "up" | "down"


def _ffn_names(family: str) -> tuple[str, tuple[str, str, str]]:
    """(module name of the MoE block, expert (gate, up, down) names)."""
    if family == "mixtral":
        return "block_sparse_moe", ("w1", "w3", "w2")
    return "mlp", ("gate_proj", "up_proj", "down_proj")


def weight_plan(cfg: ModelConfig, family: str, keys: set[str] | None = None) -> list[Piece]:
    """Every lab tensor's source. ``keys`` (the checkpoint's tensor names) picks
    the fused transformers-5 expert layout when the checkpoint has it."""
    plan = [Piece("tok_emb.weight", "copy", ("model.embed_tokens.weight",))]
    moe_block, (gate_n, up_n, down_n) = _ffn_names(family)
    for i in range(cfg.n_layers):
        hp, lp = f"model.layers.{i}.", f"blocks.{i}."
        att = hp + "self_attn."
        plan += [
            Piece(lp + "attn_norm.weight", "copy", (hp + "input_layernorm.weight",)),
            Piece(lp + "ffn_norm.weight", "copy", (hp + "post_attention_layernorm.weight",)),
            Piece(lp + "attn.qkv.weight", "cat", tuple(att + f"{n}_proj.weight" for n in "qkv")),
            Piece(lp + "attn.proj.weight", "copy", (att + "o_proj.weight",)),
        ]
        if cfg.attention_bias != "none":
            plan.append(
                Piece(lp + "attn.qkv.bias", "cat", tuple(att + f"{n}_proj.bias" for n in "qkv"))
            )
        if cfg.attention_bias == "qkvo":
            plan.append(Piece(lp + "attn.proj.bias", "copy", (att + "o_proj.bias",)))
        if cfg.qk_norm != "none":
            plan += [
                Piece(lp + "attn.q_norm.weight", "copy", (att + "q_norm.weight",)),
                Piece(lp + "attn.k_norm.weight", "copy", (att + "k_norm.weight",)),
            ]
        if not cfg.is_moe_block(i):
            mlp = hp + "mlp."
            plan += [
                Piece(lp + "ffn.w_gate.weight", "copy", (mlp + "gate_proj.weight",)),
                Piece(lp + "ffn.w_up.weight", "copy", (mlp + "up_proj.weight",)),
                Piece(lp + "ffn.w_down.weight", "copy", (mlp + "down_proj.weight",)),
            ]
            continue
        moe = hp + moe_block + "."
        plan.append(Piece(lp + "ffn.router.weight", "copy", (moe + "gate.weight",)))
        fused = keys is not None and moe + "experts.gate_up_proj" in keys
        for lab_name, hf_name, part in (
            ("w_gate", gate_n, "gate"),
            ("w_up", up_n, "up"),
            ("w_down", down_n, "down"),
        ):
            target = lp + "ffn.experts." + lab_name
            if fused:
                source = moe + ("experts.down_proj" if part == "down" else "experts.gate_up_proj")
                plan.append(Piece(target, "fused_expert", (source,), part=part))
                continue
            plan += [
                Piece(target, "expert", (moe + f"experts.{e}.{hf_name}.weight",), expert=e)
                for e in range(cfg.n_experts)
            ]
        if cfg.shared_expert_hidden:
            sh = moe + "shared_expert."
            plan += [
                Piece(lp + "ffn.shared.w_gate.weight", "copy", (sh + "gate_proj.weight",)),
                Piece(lp + "ffn.shared.w_up.weight", "copy", (sh + "up_proj.weight",)),
                Piece(lp + "ffn.shared.w_down.weight", "copy", (sh + "down_proj.weight",)),
            ]
        if cfg.shared_expert_gate:
            plan.append(
                Piece(lp + "ffn.shared_gate.weight", "copy", (moe + "shared_expert_gate.weight",))
            )
    plan.append(Piece("norm_f.weight", "copy", ("model.norm.weight",)))
    if not cfg.tie_embeddings:
        plan.append(Piece("lm_head.weight", "copy", ("lm_head.weight",)))
    return plan
