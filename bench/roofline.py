"""The memory roofline of one decode step: the bytes it must read over the device's
memory bandwidth, the fastest a step can be when it is bound by memory (decode at
small batch is: each weight is read once per step for a few rows).

    bytes = weights read + KV cache read
    weights read = every weight but the expert stacks and the embedding table
                   + the embedding rows of the batch (B x D)
                   + per MoE layer, the experts the batch touches:
                     E (1 - (1 - k / E)^B) of them (B tokens each picking k of E,
                     uniformly), 3 D H_e each
    KV cache read = per layer, keys and values of the columns attended:
                    2 x B x Hkv x hd x columns

all at the engine's storage width (bf16: 2 bytes). ``roofline_s`` divides by
the bandwidth (``HBM_BYTES_PER_S``, the vendors' data sheets). A measured step
at r x its roofline leaves r - 1 of its time to launches, syncs and compute.
"""

from __future__ import annotations

from trainer.config import ModelConfig
from trainer.model.param_count import model_params

# HBM bandwidth by device name (bytes/s, SXM parts): H200 4.8 TB/s (HBM3e),
# H100 3.35 TB/s (HBM3), A100 80GB 2.039 TB/s (HBM2e).
HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.039e12}


def expected_experts(n_experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts ``tokens`` tokens touch, each picking ``top_k`` of
    ``n_experts`` uniformly: E (1 - (1 - k / E)^B)."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


def decode_step_bytes(
    cfg: ModelConfig, vocab: int, batch: int, columns: float, width_bytes: int
) -> dict[str, float]:
    """Bytes one decode step of ``batch`` rows reads, attending over ``columns`` cache
    columns (the mean over a rollout's steps), at ``width_bytes`` per element."""
    d = cfg.d_model
    expert = 3 * d * cfg.expert_hidden  # a SwiGLU expert: gate, up (D x H) and down
    moe_layers = sum(cfg.is_moe_block(i) for i in range(cfg.n_layers))
    dense = model_params(cfg, vocab) - vocab * d - moe_layers * cfg.n_experts * expert
    if cfg.tie_embeddings:  # the head is the embedding table, read whole
        dense += vocab * d
    touched = moe_layers * expected_experts(cfg.n_experts, cfg.top_k, batch) * expert
    weights = (dense + batch * d + touched) * width_bytes
    kv = 2 * cfg.n_layers * batch * cfg.resolved_n_kv_heads * cfg.resolved_head_dim
    kv_cache = kv * columns * width_bytes
    return {"weights": weights, "kv_cache": kv_cache, "total": weights + kv_cache}


def bandwidth(device_name: str) -> float | None:
    return next((bw for key, bw in HBM_BYTES_PER_S.items() if key in device_name), None)


def roofline_s(step_bytes: float, device_name: str) -> float | None:
    """The memory-bound floor of a step, None for a device without a known bandwidth."""
    bw = bandwidth(device_name)
    return None if bw is None else step_bytes / bw
