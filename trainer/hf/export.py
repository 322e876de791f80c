"""Export a trained policy as a Hugging Face checkpoint folder.

    python -m trainer export RUN_DIR --step N --out DIR [--dtype bfloat16]

writes ``config.json`` (the source checkpoint's, with the shape fields
rewritten; or a fresh one for a builtin model, as mixtral/llama),
``model.safetensors`` (sharded with an index above ``max_shard_bytes``) in
the standard per-expert layout, and copies the source checkpoint's tokenizer
and generation files (a builtin model: its own tokenizer's files). The folder
appears whole or not at all (written next to it, then renamed), and an
existing non-empty folder is replaced only when asked (``--replace``).
transformers loads the folder to the same logits
(tests/trainer/test_hf_import_export.py, tests/trainer/test_hf_export_files.py).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from trainer.config import ModelConfig
from trainer.devices.dtypes import HF_DTYPES
from trainer.errors import FieldError
from trainer.hf.export_config import export_family, hf_config_from_model
from trainer.hf.files import INDEX_FILE, SINGLE_FILE, read_json_file
from trainer.hf.weights import SELECTION_BIAS_FAMILIES, weight_plan

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
DTYPES = HF_DTYPES  # --dtype: the Hugging Face names


def hf_tensors(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The lab ``state_dict`` as checkpoint tensors (inverse of the import plan)."""
    family = export_family(cfg)
    _check_selection_bias(state, cfg, family)
    out: dict[str, torch.Tensor] = {}
    halves: dict[str, dict[str, torch.Tensor]] = {}  # interleaved: hf name -> gate, up
    for piece in weight_plan(cfg, family):
        tensor = state[piece.lab].detach()
        if piece.kind == "copy":
            if piece.rows is not None:  # lab = hf[rows]: put the rows back
                tensor = torch.empty_like(tensor).index_copy_(0, torch.tensor(piece.rows), tensor)
            out[piece.hf[0]] = tensor
        elif piece.kind == "cat":
            out.update(zip(piece.hf, tensor.split(list(piece.sizes), dim=0), strict=True))
        elif piece.kind == "interleaved":
            halves.setdefault(piece.hf[0], {})[piece.part] = tensor
        else:  # expert slice, stored transposed
            out[piece.hf[0]] = tensor[piece.expert].t()
    for name, parts in halves.items():  # gate and up alternating on the last dim
        out[name] = torch.stack((parts["gate"], parts["up"]), dim=-1).flatten(-2)
    return out


def _check_selection_bias(state: dict[str, torch.Tensor], cfg: ModelConfig, family: str) -> None:
    """A trained selection bias (the auxiliary-loss-free stabilizer, or a checkpoint's
    correction bias) changes which experts run; a family without a place for it would
    export a different model, so that is refused."""
    if family in SELECTION_BIAS_FAMILIES or not cfg.is_moe:
        return
    biased = [k for k, v in state.items() if k.endswith(".router.selection_bias") and v.any()]
    if biased:
        raise FieldError(
            [
                (
                    "model.family",
                    f"the routers carry a selection bias ({biased[0]}, e.g. from "
                    "stabilizers.balance.aux_free_bias) that "
                    f"{family} checkpoints cannot hold; "
                    "exporting would change which experts run",
                )
            ]
        )


def _source_files(cfg: ModelConfig) -> tuple[Path | None, dict[str, Any] | None]:
    """(source folder, its config.json) of an imported model; (None, None) for the
    builtin one. A source that is gone is a FieldError: the export would lose the
    tokenizer, the token ids and the context length."""
    if cfg.source == "builtin":
        return None, None
    source = Path(cfg.source)
    if not (source / "config.json").is_file():
        raise FieldError(
            [
                (
                    "model.source",
                    f"the run's source checkpoint {source} is gone (no config.json): the "
                    "export copies its tokenizer, generation config and context length; "
                    "put the checkpoint back at that path",
                )
            ]
        )
    return source, read_json_file(source / "config.json")


def _prepare_target(out: Path, replace: bool) -> Path:
    """A fresh temporary folder next to ``out`` (same filesystem, so the final
    rename is atomic); a non-empty ``out`` is refused unless ``replace``."""
    if out.exists() and not out.is_dir():
        raise FieldError([("--out", f"{out} exists and is not a folder")])
    if out.is_dir() and any(out.iterdir()) and not replace:
        raise FieldError(
            [
                (
                    "--out",
                    f"{out} is not empty; choose a new folder or pass --replace to "
                    "replace its content",
                )
            ]
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:  # an unwritable or read-only place: the option's error
        raise FieldError(
            [("--out", f"cannot write into {out.parent}: {exc.strerror or exc}")]
        ) from None
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the export is for other readers too
    return tmp


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` folder to ``out``; an old ``out`` is renamed
    aside first and removed after, so ``out`` is never half written."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def export_hf(
    state: dict[str, torch.Tensor],
    cfg: ModelConfig,
    vocab_size: int,
    out: Path,
    dtype: str = "float32",
    max_shard_bytes: int = 2 * 1024**3,
    replace: bool = False,
    builtin_tokenizer: str | None = None,
) -> Path:
    """Write ``state`` (a TransformerLM state_dict) as an HF checkpoint folder ``out``.

    Atomic: everything is written into a temporary folder next to ``out``,
    then renamed into place. A non-empty ``out`` is refused unless ``replace``
    (then replaced as a whole: no shard of an earlier export survives). An
    imported model carries its source's tokenizer and generation files; a
    builtin model writes ``builtin_tokenizer``'s ("char" or "byte") files.
    """
    from safetensors.torch import save_file

    source, base = _source_files(cfg)
    config = hf_config_from_model(cfg, vocab_size, base)
    config["torch_dtype"] = dtype
    if source is None and builtin_tokenizer is not None:
        config.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    tensors = {
        name: t.to("cpu", DTYPES[dtype]).contiguous() for name, t in hf_tensors(state, cfg).items()
    }
    tmp = _prepare_target(out, replace)
    try:
        _write_weights(tensors, tmp, max_shard_bytes, save_file)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if source is not None:
            for name in TOKENIZER_FILES:
                if (source / name).exists():
                    shutil.copy2(source / name, tmp / name)
        elif builtin_tokenizer is not None:
            from trainer.hf.builtin_tokenizer import write_builtin_tokenizer

            ids = write_builtin_tokenizer(builtin_tokenizer, tmp)
            generation = {**ids, "do_sample": True}
            (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2))
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_weights(tensors: dict[str, torch.Tensor], out: Path, max_shard_bytes: int, save_file):
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
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2))
