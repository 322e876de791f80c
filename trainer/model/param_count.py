"""Parameter count of a config's model, estimated from the config alone (no tensors).

The platform checks it against a deployment's limit before a run is queued, so
the formula must match ``trainer.model.transformer.TransformerLM`` exactly
(tests/trainer/test_param_count.py builds the real model and compares):

    embeddings   V*D  (+ S*D for learned positions)
    per block    attention 4*D*D (fused qkv 3*D*D + out proj D*D) + 2 RMSNorms 2*D
                 (GQA, head_dim, biases and q/k norms: ``attention_params``)
                 MoE:   router E*D + experts E*3*D*H_e + shared expert 3*D*H_s (+ gate D)
                 dense: SwiGLU 3*D*H_d (gate+up 2*D*H_d, down H_d*D), also the
                        ``dense_layers`` of an MoE model
    final norm   D
    head         V*D unless tied to the embedding (+ value head D+1 for PPO)

with V the vocabulary, D ``d_model``, S ``max_seq_len``, E ``n_experts``,
H_e ``expert_hidden``, H_s ``shared_expert_hidden``, H_d the dense hidden width.
Active parameters (``active=True``) count top_k experts per MoE layer instead of E.
"""

from __future__ import annotations

from trainer.config import ExperimentConfig, ModelConfig


def swiglu_params(d_model: int, hidden: int) -> int:
    """A SwiGLU FFN without biases: gate and up (D x H each) and down (H x D)."""
    return 3 * d_model * hidden


def attention_params(cfg: ModelConfig) -> int:
    """One attention layer: fused qkv (D x (H + 2 Hkv) hd), output ((H hd) x D), their
    biases (``attention_bias``) and the q/k RMSNorms (``qk_norm``: hd each per head,
    or H hd and Hkv hd over the whole projections)."""
    d, hd = cfg.d_model, cfg.resolved_head_dim
    q_dim, kv_dim = cfg.n_heads * hd, cfg.resolved_n_kv_heads * hd
    count = d * (q_dim + 2 * kv_dim) + q_dim * d
    if cfg.attention_bias != "none":
        count += q_dim + 2 * kv_dim
    if cfg.attention_bias == "qkvo":
        count += d
    if cfg.qk_norm == "head":
        count += 2 * hd
    elif cfg.qk_norm == "full":
        count += q_dim + kv_dim
    return count


def ffn_params(cfg: ModelConfig, index: int, active: bool = False) -> int:
    """Block ``index``'s FFN: router E*D + experts (all E, or the top_k a token uses when
    ``active``) + shared expert 3*D*H_s (+ its gate D); a dense block's SwiGLU 3*D*H_d."""
    d = cfg.d_model
    if not cfg.is_moe_block(index):
        return swiglu_params(d, cfg.resolved_dense_hidden)
    experts = cfg.top_k if active else cfg.n_experts
    count = cfg.n_experts * d + experts * swiglu_params(d, cfg.expert_hidden)
    if cfg.shared_expert_hidden:
        count += swiglu_params(d, cfg.shared_expert_hidden)
    if cfg.shared_expert_gate:
        count += d
    return count


def block_params(cfg: ModelConfig, index: int = 0, active: bool = False) -> int:
    """One transformer block: attention, two RMSNorms and its FFN (MoE or dense)."""
    return attention_params(cfg) + 2 * cfg.d_model + ffn_params(cfg, index, active)


def model_params(
    cfg: ModelConfig, vocab_size: int, value_head: bool = False, active: bool = False
) -> int:
    """Total parameters of ``TransformerLM(cfg, vocab_size, value_head)`` (tied weights
    once); with ``active`` the parameters one token uses (top_k of each MoE layer's
    experts, every other weight)."""
    d = cfg.d_model
    embeddings = vocab_size * d
    if cfg.positional == "learned":
        embeddings += cfg.max_seq_len * d
    head = 0 if cfg.tie_embeddings else vocab_size * d
    value = d + 1 if value_head else 0
    blocks = sum(block_params(cfg, i, active) for i in range(cfg.n_layers))
    return embeddings + blocks + d + head + value


def config_params(cfg: ExperimentConfig) -> int:
    """Parameters of the policy a run of ``cfg`` trains (PPO adds a value head).

    The vocabulary is ``model.vocab_size`` or, when empty, the task tokenizer's.
    """
    from trainer.tasks.factory import make_task  # the task imports the config module

    vocab = cfg.model.vocab_size or make_task(cfg.task).tokenizer.vocab_size
    return model_params(cfg.model, vocab, value_head=cfg.algorithm.name == "ppo")


def format_params(count: int) -> str:
    """12_300_000 -> '12.3M'; 18_200_000_000 -> '18.2B'."""
    for scale, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if count >= scale:
            return f"{count / scale:.1f}{suffix}"
    return str(count)
