"""Check a checkpoint folder before anything trusts it, reading headers only.

    errors = validate_checkpoint("/data/ckpt/Qwen3-30B-A3B")   # [] = loads
    errors = validate_checkpoint(path, field="path", tokenizer=False)

Returns field errors ``(field, message)``, each naming the file and the
problem; never raises for a bad file. What is checked (docs/models.md,
"Files checked before they are trusted"):

* ``config.json`` parses and is a supported family whose shape is valid
  (``top_k <= experts``, heads dividing the width, ...);
* every weight file exists: ``model.safetensors``, or every shard the
  ``model.safetensors.index.json`` names, and the index names only tensors
  its shards hold;
* every safetensors header parses (the 8-byte length, the JSON header, dtypes,
  shapes and data offsets that fit inside the file: a truncated file or a
  corrupted header is caught without reading a weight);
* every tensor the model needs is there with the shape ``config.json``
  implies (hidden size, expert count and widths, heads, vocabulary) and a
  floating dtype (``WEIGHT_DTYPES``: an int32 norm is refused), and no
  tensor is left over;
* ``tokenizer.json`` loads (``tokenizer=True``) and fits the embedding, and
  the chat template, if the checkpoint has one, compiles and renders a probe
  conversation within its bounds (``trainer.hf.chat_sandbox``: time, output,
  memory, no runaway recursion); a template that refuses the probe on purpose
  (``raise_exception``) is accepted, one that breaks a bound is not.

Torch is never imported: the safetensors format is read by hand (an 8-byte
little-endian header length, then that many bytes of JSON;
https://github.com/huggingface/safetensors#format), so a web process can call
this without loading torch.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, NamedTuple

from trainer.errors import FieldError
from trainer.hf.files import INDEX_FILE, SINGLE_FILE

# Bytes per element of each safetensors dtype.
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
# A header larger than this is not a real checkpoint's (safetensors caps it at 100 MB).
MAX_HEADER_BYTES = 100 * 1024**2
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

# The dtypes a model weight may be stored in: the loader converts them to the run's
# precision. An integer "norm" (or an fp8 tensor without its scales) is refused.
WEIGHT_DTYPES = ("F16", "BF16", "F32", "F64")

Shape = tuple[int, ...]


class TensorEntry(NamedTuple):
    """One tensor of a safetensors file: its dtype, shape and the absolute byte range
    of its data in the file."""

    dtype: str
    shape: Shape
    file: Path
    begin: int
    end: int


def read_safetensors_header(path: Path) -> dict[str, TensorEntry]:
    """tensor name -> TensorEntry from a safetensors file's header; FieldError
    (on ``model.source``) naming the file for any inconsistency."""

    def bad(problem: str) -> FieldError:
        return FieldError([("model.source", f"{path.name}: {problem}")])

    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad(f"is {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise bad(f"header length {n} does not fit the {size}-byte file (truncated?)")
            raw = f.read(n)
    except OSError as exc:
        raise bad(f"cannot be read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    data_bytes = size - 8 - n
    out: dict[str, TensorEntry] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            shape = tuple(int(d) for d in shape)
            start, end = int(start), int(end)
        except (TypeError, KeyError, ValueError):
            raise bad(f"tensor {name!r} has a malformed header entry") from None
        if dtype not in DTYPE_BYTES:
            raise bad(f"tensor {name!r} has unknown dtype {dtype!r}")
        if any(d < 0 for d in shape) or not 0 <= start <= end:
            raise bad(f"tensor {name!r} has negative sizes or offsets")
        if end - start != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise bad(f"tensor {name!r}: shape {list(shape)} does not match its byte range")
        if end > data_bytes:
            raise bad(
                f"tensor {name!r} ends at byte {end} of a {data_bytes}-byte data section "
                "(the file is truncated)"
            )
        out[name] = TensorEntry(dtype, shape, path, 8 + n + start, 8 + n + end)
        ranges.append((start, end, name))
    _check_coverage(ranges, data_bytes, bad)
    return out


def _check_coverage(ranges: list[tuple[int, int, str]], data_bytes: int, bad) -> None:
    """The tensors tile the data section exactly, as the safetensors format requires
    (its loader refuses gaps, overlaps and trailing bytes): sorted by start, each
    begins where the previous ended and the last ends at the end of the file."""
    at = 0
    for start, end, name in sorted(ranges):
        if start != at:
            where = "overlaps the tensor before it" if start < at else f"leaves a gap at byte {at}"
            raise bad(f"tensor {name!r} starts at byte {start}: it {where}")
        at = end
    if at != data_bytes:
        raise bad(f"{data_bytes - at} bytes after the last tensor (trailing data)")


def checkpoint_headers(folder: Path) -> dict[str, TensorEntry]:
    """tensor name -> TensorEntry over every weight file of the checkpoint (FieldError)."""
    index = folder / INDEX_FILE
    if index.exists():
        from trainer.hf.files import read_weight_map

        weight_map = read_weight_map(index)
        files = sorted(set(weight_map.values()))
    elif (folder / SINGLE_FILE).exists():
        weight_map, files = None, [SINGLE_FILE]
    else:
        raise FieldError([("model.source", f"{folder} has neither {SINGLE_FILE} nor {INDEX_FILE}")])
    missing = [file for file in files if not (folder / file).is_file()]
    if missing:
        raise FieldError(
            [("model.source", f"shard {file} named in {INDEX_FILE} is missing") for file in missing]
        )
    shapes: dict[str, TensorEntry] = {}
    errors: list[tuple[str, str]] = []
    for file in files:
        try:
            header = read_safetensors_header(folder / file)
        except FieldError as exc:
            errors += exc.errors
            continue
        for name, entry in header.items():
            if weight_map is None or weight_map.get(name) == file:
                shapes[name] = entry
    if errors:
        raise FieldError(errors)
    if weight_map is not None:
        absent = sorted(name for name in weight_map if name not in shapes)
        if absent:
            raise FieldError(
                [
                    (
                        "model.source",
                        f"{INDEX_FILE} names {len(absent)} tensor(s) its shards do not hold, "
                        f"e.g. {absent[0]!r} in {weight_map[absent[0]]}",
                    )
                ]
            )
    return shapes


def expected_shapes(
    cfg: Any, family: str, keys: set[str], rope_interleave: bool = True
) -> dict[str, Shape]:
    """Checkpoint tensor name -> the shape ``cfg`` (a ModelConfig from config.json)
    implies, for every tensor of ``weight_plan`` (the lab's shapes from
    ``trainer.model.shapes``, mapped through the plan)."""
    from trainer.hf.weights import checkpoint_shapes, weight_plan
    from trainer.model.shapes import parameter_shapes

    lab = parameter_shapes(cfg, cfg.vocab_size)
    lab.update(router_buffer_shapes(cfg))
    return checkpoint_shapes(weight_plan(cfg, family, keys, rope_interleave), lab)


def router_buffer_shapes(cfg: Any) -> dict[str, Shape]:
    """The routers' selection-bias buffers (a checkpoint's ``e_score_correction_bias``)."""
    return {
        f"blocks.{i}.ffn.router.selection_bias": (cfg.n_experts,)
        for i in range(cfg.n_layers)
        if cfg.is_moe_block(i)
    }


def ignored_tensor(name: str, n_layers: int, mtp_layers: int) -> bool:
    """Checkpoint tensors that carry no weight of the model: old rotary caches, and the
    multi-token-prediction layers after the last block (DeepSeek-V3, GLM-4.5;
    ``trainer.hf.families_routed.mtp_layers``), which transformers ignores too."""
    if name.endswith(_IGNORED_SUFFIXES):
        return True
    if mtp_layers and name.startswith("model.layers."):
        index = name.split(".", 3)[2]
        return index.isdigit() and n_layers <= int(index) < n_layers + mtp_layers
    return False


def validate_checkpoint(
    folder: str | Path, field: str = "model.source", tokenizer: bool = True
) -> list[tuple[str, str]]:
    """Every problem that would stop ``folder`` from loading, as ``(field, message)``
    pairs reported on ``field``; ``[]`` when it loads. Reads config.json, the
    safetensors headers and (``tokenizer``) tokenizer.json; no weights."""
    try:
        _validate(Path(folder), tokenizer)
    except FieldError as exc:
        return [(field, message) for _, message in exc.errors]
    return []


def _validate(folder: Path, tokenizer: bool) -> None:
    from pydantic import ValidationError

    from trainer.config import ModelConfig
    from trainer.hf.families import SHAPE_FIELDS, model_fields_from_hf
    from trainer.hf.families_routed import mtp_layers
    from trainer.hf.files import read_hf_config

    hf = read_hf_config(folder)
    fields = model_fields_from_hf(hf)
    try:
        cfg = ModelConfig.model_validate(
            {name: fields[name] for name in SHAPE_FIELDS} | {"source": str(folder)}
        )
    except ValidationError as exc:
        problems = "; ".join(error["msg"].removeprefix("Value error, ") for error in exc.errors())
        raise FieldError([("model.source", f"config.json: {problems}")]) from None
    entries = checkpoint_headers(folder)
    shapes = {name: entry.shape for name, entry in entries.items()}
    expected = expected_shapes(cfg, cfg.family, set(shapes), bool(hf.get("rope_interleave", True)))
    errors = []
    for name, shape in expected.items():
        if name not in shapes:
            errors.append(("model.source", f"the weights have no tensor {name!r}"))
        elif shapes[name] != shape:
            errors.append(
                (
                    "model.source",
                    f"tensor {name!r} has shape {list(shapes[name])} but config.json implies "
                    f"{list(shape)}",
                )
            )
        elif entries[name].dtype not in WEIGHT_DTYPES:
            errors.append(
                (
                    "model.source",
                    f"tensor {name!r} is stored as {entries[name].dtype}; a weight must be "
                    f"one of {', '.join(WEIGHT_DTYPES)}",
                )
            )
    allowed = set(expected) | ({"lm_head.weight"} if cfg.tie_embeddings else set())
    mtp = mtp_layers(hf)
    extra = sorted(
        k for k in shapes if k not in allowed and not ignored_tensor(k, cfg.n_layers, mtp)
    )
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        errors.append(
            ("model.source", f"tensors the model has no place for: {', '.join(extra[:3])}{more}")
        )
    if errors:
        raise FieldError(errors[:10])
    if tokenizer:
        _check_tokenizer(folder, cfg.vocab_size)


def _check_tokenizer(folder: Path, vocab: int) -> None:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise FieldError([("model.source", f"{folder} has no tokenizer.json; runs encode with it")])
    from trainer.hf.tokenizer import CheckpointTokenizer, template_source

    try:
        tok = CheckpointTokenizer(folder)
        if template_source(folder) is not None:
            CheckpointTokenizer(folder, chat_template=True).probe_template()
    except FieldError:
        raise
    except Exception as exc:  # the tokenizers library raises its own kinds for a bad file
        raise FieldError([("model.source", f"tokenizer.json does not load: {exc}")]) from None
    if tok.vocab_size > vocab:
        raise FieldError(
            [
                (
                    "model.source",
                    f"tokenizer.json has {tok.vocab_size} tokens but the embedding only {vocab}",
                )
            ]
        )
