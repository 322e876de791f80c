"""Parameter count of a config's model, estimated from the config alone (no tensors).

The platform checks it against a deployment's limit before a run is queued, so
the count must match ``trainer.model.transformer.TransformerLM`` exactly: it sums the
shapes of ``trainer.model.shapes.parameter_shapes`` (tests/trainer/test_param_count.py
builds the real model and compares). In short:

    embeddings   V*D  (+ S*D for learned positions)
    per block    attention 4*D*D (fused qkv 3*D*D + out proj D*D) + 2 RMSNorms 2*D
                 (GQA, head_dim, biases and q/k norms: ``attention_params``)
                 MoE:   router E*D + experts E*3*D*H_e + shared expert 3*D*H_s (+ gate D)
                 dense: SwiGLU 3*D*H_d (gate+up 2*D*H_d, down H_d*D), also the
                        ``dense_layers`` of an MoE model
    final norm   D
    head         V*D unless tied to the embedding (+ value head D+1 for PPO)

with V the vocabulary, D ``d_model``, S ``max_seq_len``, E ``n_experts``,
H_e ``expert_hidden``, H_s ``shared_expert_hidden``, H_d the dense hidden width (the
latent attention, sinks, router and expert biases: ``trainer.model.shapes``).
Active parameters (``active=True``) count top_k experts per MoE layer instead of E.
"""

from __future__ import annotations

from math import prod

from trainer.config import ExperimentConfig, ModelConfig
from trainer.model.shapes import attention_shapes, is_routed_expert
from trainer.model.shapes import parameter_shapes as parameter_shapes


def swiglu_params(d_model: int, hidden: int) -> int:
    """A SwiGLU FFN without biases: gate and up (D x H each) and down (H x D)."""
    return 3 * d_model * hidden


def _count(shapes: dict[str, tuple[int, ...]], active: tuple[int, int] = (1, 1)) -> int:
    """Sum of the shapes' sizes; routed-expert tensors (E on dim 0) scaled by
    ``active`` = (top_k, E) for the parameters one token uses."""
    used, of = active
    return sum(
        prod(shape) // of * used if is_routed_expert(name) else prod(shape)
        for name, shape in shapes.items()
    )


def attention_params(cfg: ModelConfig) -> int:
    """One attention layer (``trainer.model.shapes.attention_shapes``): fused qkv, output,
    biases, q/k norms and sinks, or the latent attention's projections and norms."""
    return _count(attention_shapes(cfg, ""))


def _active_share(cfg: ModelConfig, active: bool) -> tuple[int, int]:
    return (cfg.top_k, cfg.n_experts) if active and cfg.is_moe else (1, 1)


def model_params(
    cfg: ModelConfig, vocab_size: int, value_head: bool = False, active: bool = False
) -> int:
    """Total parameters of ``TransformerLM(cfg, vocab_size, value_head)`` (tied weights
    once); with ``active`` the parameters one token uses (top_k of each MoE layer's
    experts, every other weight)."""
    return _count(parameter_shapes(cfg, vocab_size, value_head), _active_share(cfg, active))


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
