"""Export a trained policy as a Hugging Face checkpoint folder.

    python -m trainer export RUN_DIR --step N --out DIR [--dtype bfloat16]

writes ``config.json`` (the source checkpoint's, with the shape fields
rewritten; or a fresh one for a builtin model, as mixtral/llama),
``model.safetensors`` (sharded with an index above ``max_shard_bytes``) in
the standard per-expert layout, and copies the source checkpoint's tokenizer
and generation files. transformers loads the folder to the same logits
(tests/trainer/test_hf_export.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from trainer.config import ModelConfig
from trainer.errors import FieldError
from trainer.hf.families import export_family, hf_config_from_model
from trainer.hf.loader import INDEX_FILE, SINGLE_FILE
from trainer.hf.weights import weight_plan

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "generation_config.json",
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def hf_tensors(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The lab ``state_dict`` as checkpoint tensors (inverse of the import plan)."""
    qkv_sizes = (
        cfg.n_heads * cfg.resolved_head_dim,
        cfg.resolved_n_kv_heads * cfg.resolved_head_dim,
        cfg.resolved_n_kv_heads * cfg.resolved_head_dim,
    )
    out: dict[str, torch.Tensor] = {}
    for piece in weight_plan(cfg, export_family(cfg)):
        tensor = state[piece.lab].detach()
        if piece.kind == "copy":
            out[piece.hf[0]] = tensor
        elif piece.kind == "cat":
            sizes = qkv_sizes if len(piece.hf) == 3 else [tensor.shape[0] // 2] * 2
            out.update(zip(piece.hf, tensor.split(sizes, dim=0), strict=True))
        else:  # expert slice, stored transposed
            out[piece.hf[0]] = tensor[piece.expert].t()
    return out


def export_hf(
    state: dict[str, torch.Tensor],
    cfg: ModelConfig,
    vocab_size: int,
    out: Path,
    dtype: str = "float32",
    max_shard_bytes: int = 2 * 1024**3,
) -> Path:
    """Write ``state`` (a TransformerLM state_dict) as an HF checkpoint into ``out``."""
    from safetensors.torch import save_file

    base = None
    source = Path(cfg.source) if cfg.source != "builtin" else None
    if source is not None and (source / "config.json").exists():
        base = json.loads((source / "config.json").read_text())
    config = hf_config_from_model(cfg, vocab_size, base)
    config["torch_dtype"] = dtype
    tensors = {
        name: t.to("cpu", DTYPES[dtype]).contiguous() for name, t in hf_tensors(state, cfg).items()
    }
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out / SINGLE_FILE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, file))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if source is not None:
        for name in TOKENIZER_FILES:
            if (source / name).exists():
                shutil.copy2(source / name, out / name)
    return out


def export_run(run_dir: Path, step: int, out: Path, dtype: str = "float32") -> Path:
    """Export the policy of ``run_dir``'s checkpoint taken after ``step`` RL steps."""
    from trainer.checkpoint import checkpoint_path, load_checkpoint, read_sharded_policy
    from trainer.run_files import CONFIG_FILE
    from trainer.validation import validate_config

    config_file = run_dir / CONFIG_FILE
    if not config_file.exists():
        raise FieldError([("RUN_DIR", f"{run_dir} has no {CONFIG_FILE}; is it a run folder?")])
    if dtype not in DTYPES:
        raise FieldError([("--dtype", f"choose one of {', '.join(DTYPES)}")])
    cfg = validate_config(json.loads(config_file.read_text()))
    ckpt = load_checkpoint(run_dir)
    if ckpt is None:
        raise FieldError([("RUN_DIR", f"{run_dir} has no checkpoint ({checkpoint_path(run_dir)})")])
    saved_step = int(ckpt["run_state"]["step"])
    if saved_step != step:
        raise FieldError(
            [("--step", f"the run keeps only its last checkpoint, taken after step {saved_step}")]
        )
    policy: dict[str, Any] = ckpt["policy"]
    if policy is None and ckpt.get("sharded"):  # an FSDP run: merge its shards
        policy = read_sharded_policy(run_dir, ckpt["sharded"])
    vocab_size = int(policy["tok_emb.weight"].shape[0])
    return export_hf(policy, cfg.model, vocab_size, out, dtype)
