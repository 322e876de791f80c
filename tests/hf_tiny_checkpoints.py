"""Tiny random Hugging Face checkpoints made offline with transformers' own
classes (``XForCausalLM(config)`` + ``save_pretrained``), for the import,
parity and export tests and the import benchmark.

Norm weights, biases, attention sinks and DeepSeek's correction bias are randomised
too (transformers initialises them to 1 and 0), so a mapping that swapped or dropped
one would show in the logits or the routing.
"""

from __future__ import annotations

from pathlib import Path

import torch

COMMON = {
    "vocab_size": 96,
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "initializer_range": 0.1,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}

FAMILY_KWARGS = {
    "qwen3_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "intermediate_size": 96,
        "mlp_only_layers": [1],
        "norm_topk_prob": True,
        "head_dim": 24,
        "rope_theta": 1_000_000.0,
    },
    "qwen2_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "intermediate_size": 96,
        "norm_topk_prob": False,
    },
    "olmoe": {"num_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32},
    "mixtral": {
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 32,
        "rope_theta": 1_000_000.0,
    },
    # Every routing and attention feature at once: latent attention with q compression,
    # interleaved rope under yarn with both mscales, sigmoid scores with the correction
    # bias in 4 groups (2 kept), routed scaling, a shared expert, a dense first block.
    "deepseek_v3": {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "intermediate_size": 96,
        "n_shared_experts": 1,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
        "num_key_value_heads": 4,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "mscale": 0.9,
            "mscale_all_dim": 0.8,
        },
    },
    # DeepSeek-V2-Lite's shape: no q compression; softmax, group-limited greedy top-k.
    "deepseek_v2": {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "intermediate_size": 96,
        "n_shared_experts": 2,
        "n_group": 4,
        "topk_group": 2,
        "topk_method": "group_limited_greedy",
        "routed_scaling_factor": 1.5,
        "first_k_dense_replace": 1,
        "q_lora_rank": None,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
        "num_key_value_heads": 4,
    },
    # GLM-4.5: partial rotary (half the head), q/k norm, q/k/v biases, sigmoid groups.
    "glm4_moe": {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "intermediate_size": 96,
        "n_shared_experts": 1,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 1.5,
        "first_k_dense_replace": 1,
        "use_qk_norm": True,
        "attention_bias": True,
        "head_dim": 16,
        "partial_rotary_factor": 0.5,
    },
    # GPT-OSS: sinks, alternating sliding (window 4) / full layers, q/k/v/o biases, a
    # router bias, experts with biases and a clamp (limit 1) the tiny activations reach.
    "gpt_oss": {
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 32,
        "head_dim": 16,
        "sliding_window": 4,
        "swiglu_limit": 1.0,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
    },
    "qwen3": {"intermediate_size": 96, "head_dim": 24},
    "qwen2": {"intermediate_size": 96},
    "llama": {"intermediate_size": 96, "num_key_value_heads": 4},
}


def hf_classes(family: str):
    import transformers as tf

    return {
        "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
        "qwen2_moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM),
        "olmoe": (tf.OlmoeConfig, tf.OlmoeForCausalLM),
        "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM),
        "deepseek_v3": (tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM),
        "deepseek_v2": (tf.DeepseekV2Config, tf.DeepseekV2ForCausalLM),
        "glm4_moe": (tf.Glm4MoeConfig, tf.Glm4MoeForCausalLM),
        "gpt_oss": (tf.GptOssConfig, tf.GptOssForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
    }[family]


def make_hf_model(family: str, seed: int = 0, **overrides):
    """A random transformers model of ``family`` (fp32, eval mode)."""
    config_cls, model_cls = hf_classes(family)
    kwargs = {**COMMON, **FAMILY_KWARGS[family], **overrides}
    config = config_cls(**kwargs)
    config.pad_token_id = None
    config.eos_token_id = None
    config.bos_token_id = None
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                if name.endswith(("bias", "sinks")):
                    param.normal_(0.0, 0.1)
                else:
                    param.uniform_(0.5, 1.5)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # the selection bias, live
                buffer.normal_(0.0, 0.05)
    return model


def save_hf_checkpoint(
    family: str, folder: Path, seed: int = 0, max_shard_size: str | None = None, **overrides
):
    """Save a tiny random checkpoint of ``family`` into ``folder`` (in shards of at
    most ``max_shard_size``, e.g. "100KB", when given); returns the model."""
    model = make_hf_model(family, seed, **overrides)
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return model


def import_checkpoint(folder: Path, max_seq_len: int = 256):
    """The lab's (model config, eval-mode model) for a checkpoint folder, as a run
    imports it (``resolve_model_source`` + ``build_model``)."""
    from trainer.config import ExperimentConfig
    from trainer.hf import build_model, resolve_model_source

    data = {"model": {"source": str(folder), "max_seq_len": max_seq_len}}
    model_cfg = resolve_model_source(ExperimentConfig.model_validate(data)).model
    return model_cfg, build_model(model_cfg, model_cfg.vocab_size).eval()


def save_char_tokenizer(folder: Path, characters: str | None = None) -> None:
    """A character-level tokenizer.json (+ tokenizer_config.json) covering the
    lab's task alphabet (or ``characters``), made with the ``tokenizers``
    library: <pad>, <bos>, <eos>, then one token per character (the
    checkpoint's vocabulary is larger; the extra ids decode to nothing). Its
    post-processor prepends <bos>, as Llama's does: ``tokenizer(prompt)`` starts
    with BOS in transformers and in the lab alike."""
    import json

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    from trainer.tasks.tokenizer import CHARACTERS

    alphabet = CHARACTERS if characters is None else characters
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2} | {ch: 3 + i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<pad>", "<bos>", "<eos>"])  # matched in text, as real tokenizers do
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 1)]
    )
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<bos>", "eos_token": {"content": "<eos>"}, "pad_token": "<pad>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def word_problem_characters() -> str:
    """Every character of the shipped word problems, in a fixed order."""
    import json

    from trainer.tasks.text_data import SHIPPED_DATA

    text = "".join(
        row["question"] + row["answer"]
        for row in map(json.loads, (SHIPPED_DATA / "word_problems.jsonl").read_text().splitlines())
    )
    return "".join(sorted(set(text)))


def poisoned(clean: Path, folder: Path, tensor: str, value: float, index: int | None = 3) -> Path:
    """A copy of checkpoint ``clean`` with element ``index`` of ``tensor`` (every
    element: None) overwritten in place with ``value``."""
    import shutil
    import struct

    import numpy as np

    from trainer.hf.validate import read_safetensors_header

    shutil.copytree(clean, folder)
    file = folder / "model.safetensors"
    entry = read_safetensors_header(file)[tensor]
    encode = {
        "F32": lambda: struct.pack("<f", value),
        "F16": lambda: np.float16(value).tobytes(),
        "BF16": lambda: struct.pack("<f", value)[2:],
    }
    raw = encode[entry.dtype]()
    count = (entry.end - entry.begin) // len(raw)
    with file.open("r+b") as f:
        f.seek(entry.begin + (0 if index is None else index * len(raw)))
        f.write(raw * (count if index is None else 1))
    return folder


def retyped(clean: Path, folder: Path, tensor: str) -> Path:
    """A copy of checkpoint ``clean`` whose F32 ``tensor`` is stored as I32 (same bytes)."""
    import json
    import shutil
    import struct

    shutil.copytree(clean, folder)
    file = folder / "model.safetensors"
    data = file.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    assert header[tensor]["dtype"] == "F32"
    header[tensor]["dtype"] = "I32"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (n - len(text)) if len(text) <= n else b""
    assert len(text) == n
    file.write_bytes(data[:8] + text + data[8 + n :])
    return folder
