"""Every parameter of ``TransformerLM(cfg, vocab)`` by name and shape, from the config
alone (torch-free): the parameter count (``trainer.model.param_count``) and the
checkpoint validator's expected tensor shapes (``trainer.hf.validate``) both read it,
and tests/trainer/test_param_count.py holds it against the built model's
``named_parameters()`` (a tied head appears once, as ``tok_emb.weight``).

Per block (V vocabulary, D d_model, H heads, Hkv key/value heads, hd head_dim):

    attention   qkv ((H + 2 Hkv) hd, D) [+ bias], proj (D, H hd) [+ bias], q/k norms,
                sinks (H,); or the latent attention's q_a/q_a_norm/q_b (or q), kv_a,
                kv_a_norm, kv_b, proj (trainer.model.mla)
    MoE         router (E, D) [+ bias (E,)], experts w_gate/w_up (E, D, H_e), w_down
                (E, H_e, D) [+ biases (E, H_e), (E, H_e), (E, D)], shared SwiGLU
                [+ gate (1, D)]
    dense       SwiGLU w_gate/w_up (H_d, D), w_down (D, H_d)
"""

from __future__ import annotations

from typing import Any

Shape = tuple[int, ...]


def _swiglu(prefix: str, d: int, hidden: int) -> dict[str, Shape]:
    return {
        prefix + "w_gate.weight": (hidden, d),
        prefix + "w_up.weight": (hidden, d),
        prefix + "w_down.weight": (d, hidden),
    }


def attention_shapes(cfg: Any, prefix: str) -> dict[str, Shape]:
    """One block's attention parameters (``prefix`` = ``blocks.{i}.attn.``)."""
    d, h = cfg.d_model, cfg.n_heads
    if cfg.mla.enabled:
        m = cfg.mla
        out: dict[str, Shape] = {}
        if m.q_lora_rank:
            out[prefix + "q_a.weight"] = (m.q_lora_rank, d)
            out[prefix + "q_a_norm.weight"] = (m.q_lora_rank,)
            out[prefix + "q_b.weight"] = (h * m.qk_head_dim, m.q_lora_rank)
        else:
            out[prefix + "q.weight"] = (h * m.qk_head_dim, d)
        out[prefix + "kv_a.weight"] = (m.kv_lora_rank + m.qk_rope_head_dim, d)
        out[prefix + "kv_a_norm.weight"] = (m.kv_lora_rank,)
        out[prefix + "kv_b.weight"] = (h * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
        out[prefix + "proj.weight"] = (d, h * m.v_head_dim)
        return out
    hd = cfg.resolved_head_dim
    q_dim, kv_dim = h * hd, cfg.resolved_n_kv_heads * hd
    out = {prefix + "qkv.weight": (q_dim + 2 * kv_dim, d)}
    if cfg.attention_bias != "none":
        out[prefix + "qkv.bias"] = (q_dim + 2 * kv_dim,)
    out[prefix + "proj.weight"] = (d, q_dim)
    if cfg.attention_bias == "qkvo":
        out[prefix + "proj.bias"] = (d,)
    if cfg.qk_norm == "head":
        out[prefix + "q_norm.weight"] = (hd,)
        out[prefix + "k_norm.weight"] = (hd,)
    elif cfg.qk_norm == "full":
        out[prefix + "q_norm.weight"] = (q_dim,)
        out[prefix + "k_norm.weight"] = (kv_dim,)
    if cfg.attention_sinks:
        out[prefix + "sinks"] = (h,)
    return out


def ffn_shapes(cfg: Any, index: int, prefix: str) -> dict[str, Shape]:
    """Block ``index``'s FFN parameters (``prefix`` = ``blocks.{i}.ffn.``)."""
    d = cfg.d_model
    if not cfg.is_moe_block(index):
        return _swiglu(prefix, d, cfg.resolved_dense_hidden)
    e, h = cfg.n_experts, cfg.expert_hidden
    out: dict[str, Shape] = {prefix + "router.weight": (e, d)}
    if cfg.router.bias:
        out[prefix + "router.bias"] = (e,)
    out[prefix + "experts.w_gate"] = (e, d, h)
    out[prefix + "experts.w_up"] = (e, d, h)
    out[prefix + "experts.w_down"] = (e, h, d)
    if cfg.expert_ffn.bias:
        out[prefix + "experts.b_gate"] = (e, h)
        out[prefix + "experts.b_up"] = (e, h)
        out[prefix + "experts.b_down"] = (e, d)
    if cfg.shared_expert_hidden:
        out.update(_swiglu(prefix + "shared.", d, cfg.shared_expert_hidden))
    if cfg.shared_expert_gate:
        out[prefix + "shared_gate.weight"] = (1, d)
    return out


def block_shapes(cfg: Any, index: int) -> dict[str, Shape]:
    """Every parameter of block ``index`` (``blocks.{i}.``)."""
    p = f"blocks.{index}."
    d = cfg.d_model
    out = {p + "attn_norm.weight": (d,)}
    out.update(attention_shapes(cfg, p + "attn."))
    out[p + "ffn_norm.weight"] = (d,)
    out.update(ffn_shapes(cfg, index, p + "ffn."))
    return out


def parameter_shapes(cfg: Any, vocab_size: int, value_head: bool = False) -> dict[str, Shape]:
    """name -> shape of every parameter of ``TransformerLM(cfg, vocab_size, value_head)``
    (a ``ModelConfig``), in ``named_parameters()`` order up to the blocks' insides."""
    d = cfg.d_model
    out: dict[str, Shape] = {"tok_emb.weight": (vocab_size, d)}
    if cfg.positional == "learned":
        out["pos_emb.weight"] = (cfg.max_seq_len, d)
    for i in range(cfg.n_layers):
        out.update(block_shapes(cfg, i))
    out["norm_f.weight"] = (d,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (vocab_size, d)
    if value_head:
        out["value_head.weight"] = (1, d)
        out["value_head.bias"] = (1,)
    return out


def is_routed_expert(name: str) -> bool:
    """A stacked routed-expert tensor (expert on dim 0): ``...ffn.experts.*``."""
    return ".ffn.experts." in name
