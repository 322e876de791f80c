"""Weight names: the lab's ``state_dict`` <-> a Hugging Face checkpoint's tensors.

One plan serves both directions (``weight_plan``): each ``Piece`` says how one
lab tensor (or one expert's slice of it) is made from checkpoint tensors:

* ``copy``: the same tensor (norms, embeddings, o_proj, routers, ...); with ``rows``
  the lab tensor is the checkpoint's rows in that order (``lab = hf[rows]``);
* ``cat``: concatenated along dim 0 (q|k|v -> ``attn.qkv``, of ``sizes`` rows each),
  split back on export;
* ``expert``: expert ``e``'s slice ``param[e]`` is the transpose of the
  checkpoint's per-expert matrix (the lab stores experts as (E, D, H) / (E, H, D)
  for ``x @ w`` grouped matmuls; HF stores nn.Linear weights (out, in));
* ``fused_expert``: transformers 5's fused in-memory layout (``experts.gate_up_proj``
  (E, 2H, D), ``experts.down_proj`` (E, D, H)), read too;
* ``interleaved``: GPT-OSS's ``experts.gate_up_proj`` (E, D, 2H) and its bias (E, 2H),
  gate and up alternating on the last dim (``gate = [..., ::2]``, ``up = [..., 1::2]``).

DeepSeek stores the rotary part of each query head and of the shared rotary key with
its dims interleaved in pairs (``rope_interleave``; DeepSeek-V2 always): the plan
reorders those rows to [even dims, odd dims] (``rope_rows``), after which the pairs'
rotation is the rotate-half rotation every other family uses, bit for bit
(transformers' ``apply_rotary_pos_emb_interleave`` computes exactly that); export
puts them back.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import ModelConfig


@dataclass(frozen=True)
class Piece:
    lab: str  # lab state_dict key
    kind: str  # "copy" | "cat" | "expert" | "fused_expert" | "interleaved"
    hf: tuple[str, ...]  # checkpoint keys
    expert: int = -1  # expert index for "expert"
    part: str = ""  # fused_expert / interleaved: "gate" | "up" | "down"
    sizes: tuple[int, ...] = ()  # cat: rows of each checkpoint tensor
    rows: tuple[int, ...] | None = None  # copy: lab = hf[rows]


# The lab's router buffer a checkpoint's correction bias fills (DeepSeek-V3, GLM-4.5).
SELECTION_BIAS_FAMILIES = ("deepseek_v3", "glm4_moe")
LATENT_FAMILIES = ("deepseek_v3", "deepseek_v2")


def _ffn_names(family: str) -> tuple[str, tuple[str, str, str]]:
    """(module name of the MoE block, expert (gate, up, down) names)."""
    if family == "mixtral":
        return "block_sparse_moe", ("w1", "w3", "w2")
    return "mlp", ("gate_proj", "up_proj", "down_proj")


def rope_rows(width: int) -> list[int]:
    """Interleaved pairs -> rotate-half order: [0, 2, 4, ..., 1, 3, 5, ...]."""
    return list(range(0, width, 2)) + list(range(1, width, 2))


def weight_plan(
    cfg: ModelConfig, family: str, keys: set[str] | None = None, rope_interleave: bool = True
) -> list[Piece]:
    """Every lab tensor's source. ``keys`` (the checkpoint's tensor names) picks
    the fused transformers-5 expert layout when the checkpoint has it;
    ``rope_interleave``: a DeepSeek-V3 checkpoint's rotary dims are stored in pairs
    (its config's ``rope_interleave``, true by default; DeepSeek-V2 always)."""
    plan = [Piece("tok_emb.weight", "copy", ("model.embed_tokens.weight",))]
    interleaved = family == "deepseek_v2" or (family == "deepseek_v3" and rope_interleave)
    for i in range(cfg.n_layers):
        hp, lp = f"model.layers.{i}.", f"blocks.{i}."
        plan += [
            Piece(lp + "attn_norm.weight", "copy", (hp + "input_layernorm.weight",)),
            Piece(lp + "ffn_norm.weight", "copy", (hp + "post_attention_layernorm.weight",)),
        ]
        if cfg.mla.enabled:
            plan += _latent_attention(cfg, lp + "attn.", hp + "self_attn.", interleaved)
        else:
            plan += _attention(cfg, lp + "attn.", hp + "self_attn.")
        if cfg.is_moe_block(i):
            plan += _moe(cfg, family, lp + "ffn.", hp, keys)
        else:
            mlp = hp + "mlp."
            plan += [
                Piece(lp + "ffn.w_gate.weight", "copy", (mlp + "gate_proj.weight",)),
                Piece(lp + "ffn.w_up.weight", "copy", (mlp + "up_proj.weight",)),
                Piece(lp + "ffn.w_down.weight", "copy", (mlp + "down_proj.weight",)),
            ]
    plan.append(Piece("norm_f.weight", "copy", ("model.norm.weight",)))
    if not cfg.tie_embeddings:
        plan.append(Piece("lm_head.weight", "copy", ("lm_head.weight",)))
    return plan


def _attention(cfg: ModelConfig, lp: str, att: str) -> list[Piece]:
    hd = cfg.resolved_head_dim
    q, kv = cfg.n_heads * hd, cfg.resolved_n_kv_heads * hd
    qkv = tuple(att + f"{n}_proj.weight" for n in "qkv")
    plan = [
        Piece(lp + "qkv.weight", "cat", qkv, sizes=(q, kv, kv)),
        Piece(lp + "proj.weight", "copy", (att + "o_proj.weight",)),
    ]
    if cfg.attention_bias != "none":
        biases = tuple(att + f"{n}_proj.bias" for n in "qkv")
        plan.append(Piece(lp + "qkv.bias", "cat", biases, sizes=(q, kv, kv)))
    if cfg.attention_bias == "qkvo":
        plan.append(Piece(lp + "proj.bias", "copy", (att + "o_proj.bias",)))
    if cfg.qk_norm != "none":
        plan += [
            Piece(lp + "q_norm.weight", "copy", (att + "q_norm.weight",)),
            Piece(lp + "k_norm.weight", "copy", (att + "k_norm.weight",)),
        ]
    if cfg.attention_sinks:
        plan.append(Piece(lp + "sinks", "copy", (att + "sinks",)))
    return plan


def _latent_attention(cfg: ModelConfig, lp: str, att: str, interleaved: bool) -> list[Piece]:
    m = cfg.mla
    q_rows = kv_rows = None
    if interleaved:
        rope = rope_rows(m.qk_rope_head_dim)
        per_head = list(range(m.qk_nope_head_dim)) + [m.qk_nope_head_dim + j for j in rope]
        q_rows = tuple(h * m.qk_head_dim + j for h in range(cfg.n_heads) for j in per_head)
        kv_rows = tuple(range(m.kv_lora_rank)) + tuple(m.kv_lora_rank + j for j in rope)
    if m.q_lora_rank:
        plan = [
            Piece(lp + "q_a.weight", "copy", (att + "q_a_proj.weight",)),
            Piece(lp + "q_a_norm.weight", "copy", (att + "q_a_layernorm.weight",)),
            Piece(lp + "q_b.weight", "copy", (att + "q_b_proj.weight",), rows=q_rows),
        ]
    else:
        plan = [Piece(lp + "q.weight", "copy", (att + "q_proj.weight",), rows=q_rows)]
    plan += [
        Piece(lp + "kv_a.weight", "copy", (att + "kv_a_proj_with_mqa.weight",), rows=kv_rows),
        Piece(lp + "kv_a_norm.weight", "copy", (att + "kv_a_layernorm.weight",)),
        Piece(lp + "kv_b.weight", "copy", (att + "kv_b_proj.weight",)),
        Piece(lp + "proj.weight", "copy", (att + "o_proj.weight",)),
    ]
    return plan


def _moe(cfg: ModelConfig, family: str, lp: str, hp: str, keys: set[str] | None) -> list[Piece]:
    moe_block, (gate_n, up_n, down_n) = _ffn_names(family)
    moe = hp + moe_block + "."
    if family == "gpt_oss":
        return _gpt_oss_moe(lp, moe)
    plan = [Piece(lp + "router.weight", "copy", (moe + "gate.weight",))]
    if family in SELECTION_BIAS_FAMILIES:
        plan.append(
            Piece(lp + "router.selection_bias", "copy", (moe + "gate.e_score_correction_bias",))
        )
    fused = keys is not None and moe + "experts.gate_up_proj" in keys
    for lab_name, hf_name, part in (
        ("w_gate", gate_n, "gate"),
        ("w_up", up_n, "up"),
        ("w_down", down_n, "down"),
    ):
        target = lp + "experts." + lab_name
        if fused:
            source = moe + ("experts.down_proj" if part == "down" else "experts.gate_up_proj")
            plan.append(Piece(target, "fused_expert", (source,), part=part))
            continue
        plan += [
            Piece(target, "expert", (moe + f"experts.{e}.{hf_name}.weight",), expert=e)
            for e in range(cfg.n_experts)
        ]
    if cfg.shared_expert_hidden:
        sh = moe + ("shared_experts." if family in SHARED_EXPERTS_FAMILIES else "shared_expert.")
        plan += [
            Piece(lp + "shared.w_gate.weight", "copy", (sh + "gate_proj.weight",)),
            Piece(lp + "shared.w_up.weight", "copy", (sh + "up_proj.weight",)),
            Piece(lp + "shared.w_down.weight", "copy", (sh + "down_proj.weight",)),
        ]
    if cfg.shared_expert_gate:
        plan.append(Piece(lp + "shared_gate.weight", "copy", (moe + "shared_expert_gate.weight",)))
    return plan


# DeepSeek's (and GLM-4.5's) ungated shared experts module name (Qwen2-MoE: shared_expert).
SHARED_EXPERTS_FAMILIES = ("deepseek_v3", "deepseek_v2", "glm4_moe")


def _gpt_oss_moe(lp: str, moe: str) -> list[Piece]:
    """GPT-OSS: router with a bias; experts fused and gate/up interleaved, (in, out)."""
    ex = moe + "experts."
    return [
        Piece(lp + "router.weight", "copy", (moe + "router.weight",)),
        Piece(lp + "router.bias", "copy", (moe + "router.bias",)),
        Piece(lp + "experts.w_gate", "interleaved", (ex + "gate_up_proj",), part="gate"),
        Piece(lp + "experts.w_up", "interleaved", (ex + "gate_up_proj",), part="up"),
        Piece(lp + "experts.b_gate", "interleaved", (ex + "gate_up_proj_bias",), part="gate"),
        Piece(lp + "experts.b_up", "interleaved", (ex + "gate_up_proj_bias",), part="up"),
        Piece(lp + "experts.w_down", "copy", (ex + "down_proj",)),
        Piece(lp + "experts.b_down", "copy", (ex + "down_proj_bias",)),
    ]


def checkpoint_shapes(
    plan: list[Piece], lab_shapes: dict[str, tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> the shape the plan implies from the lab tensors' shapes
    (``trainer.model.shapes.parameter_shapes``, plus the selection-bias buffers)."""
    out: dict[str, tuple[int, ...]] = {}
    for piece in plan:
        shape = lab_shapes[piece.lab]
        if piece.kind == "copy":
            out[piece.hf[0]] = shape
        elif piece.kind == "cat":
            out.update(
                (name, (size, *shape[1:])) for name, size in zip(piece.hf, piece.sizes, strict=True)
            )
        elif piece.kind == "expert":
            out[piece.hf[0]] = (shape[2], shape[1])
        elif piece.kind == "fused_expert":  # (out, in) per expert; gate|up stacked
            e, a, b = shape
            out[piece.hf[0]] = (e, b, a) if piece.part == "down" else (e, 2 * b, a)
        else:  # interleaved: the last dim holds gate and up
            out[piece.hf[0]] = (*shape[:-1], 2 * shape[-1])
    return out
