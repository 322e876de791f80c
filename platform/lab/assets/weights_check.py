"""A checkpoint's safetensors files checked against its config.json, reading the
headers only (never the weights).

Each file is opened with the ``safetensors`` library, which parses the header
and checks that the tensors' byte ranges cover the file exactly, so a
truncated file, a corrupted header or a file that is not safetensors at all
fails here. Every tensor's shape (from the header) is then compared with the
shape the model built from config.json expects (``trainer.hf.weights``'s
plan, the one the loader follows), with the model built on PyTorch's meta
device: no parameter memory. A missing shard, a missing tensor, a tensor the
architecture has no place for and a shape mismatch (hidden size, expert count)
are each a field error naming the file and the tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.config import ModelConfig
from trainer.errors import FieldError

# Tensors some checkpoints carry that hold no weights (old rotary caches).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _error(field: str, message: str) -> FieldError:
    return FieldError([(field, message)])


def tensor_shapes(folder: Path, field: str = "path") -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over the checkpoint's safetensors files, from their headers."""
    from safetensors import safe_open

    from trainer.hf.loader import INDEX_FILE, SINGLE_FILE

    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (ValueError, KeyError, TypeError) as exc:
            raise _error(field, f"{INDEX_FILE} is not a valid index: {exc}") from None
        files = sorted(set(weight_map.values()))
    elif (folder / SINGLE_FILE).is_file():
        weight_map, files = None, [SINGLE_FILE]
    else:
        raise _error(field, f"{folder} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    shapes: dict[str, tuple[int, ...]] = {}
    where: dict[str, str] = {}
    for name in files:
        file = folder / name
        if not isinstance(name, str) or Path(name).name != name:
            raise _error(field, f"{INDEX_FILE} names {name!r}, not a file of the folder")
        if not file.is_file():
            raise _error(field, f"shard {name} is missing ({INDEX_FILE} lists it)")
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - a safe_open handle, not a dict
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
                    where[key] = name
        except Exception as exc:  # SafetensorError, OSError: the library's own words
            raise _error(
                field, f"{name} is not a readable safetensors file ({exc}); truncated or corrupted?"
            ) from None
    if weight_map is not None:
        for key, name in weight_map.items():
            if where.get(key) != name:
                raise _error(field, f"{INDEX_FILE} puts tensor {key!r} in {name}, which lacks it")
    return shapes


def expected_shapes(piece: Any, target: tuple[int, ...], found: dict) -> list[str]:
    """Mismatches of one plan piece (``trainer.hf.weights.Piece``) against ``target``,
    the lab parameter's shape, as messages."""
    got = [found[name] for name in piece.hf]
    if piece.kind == "copy":
        ok = got[0] == target
        want = str(target)
    elif piece.kind == "cat":  # q|k|v stacked along dim 0
        ok = all(g[1:] == target[1:] for g in got) and sum(g[0] for g in got) == target[0]
        want = f"dim 0 adding up to {target[0]} and {target[1:]} after it"
    elif piece.kind == "expert":  # expert e of (E, D, H) is stored transposed: (H, D)
        want_shape = tuple(reversed(target[1:]))
        ok, want = got[0] == want_shape, str(want_shape)
    else:  # fused (E, 2H, D) gate|up, or (E, D, H) down stored as (E, H', D')
        e, a, b = target
        want_shape = (e, b, a) if piece.part == "down" else (e, 2 * b, a)
        ok, want = got[0] == want_shape, str(want_shape)
    if ok:
        return []
    shown = ", ".join(f"{n} {g}" for n, g in zip(piece.hf, got, strict=True))
    return [f"tensor {shown} but config.json makes {piece.lab} expect {want}"]


def check_weights(
    folder: Path, model: ModelConfig, vocab_size: int, field: str = "path"
) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint against the model config.json describes;
    FieldError on ``field`` for the first problems found. Returns the shapes."""
    import torch

    from trainer.hf.weights import weight_plan
    from trainer.model.transformer import TransformerLM

    shapes = tensor_shapes(folder, field)
    with torch.device("meta"):  # shapes only: no parameter memory is allocated
        built = TransformerLM(model, vocab_size)
    params = {name: tuple(p.shape) for name, p in built.named_parameters()}
    plan = weight_plan(model, model.family, set(shapes))
    missing = sorted({name for piece in plan for name in piece.hf if name not in shapes})
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise _error(
            field,
            f"the weights lack tensor {', '.join(missing[:3])}{more} that config.json "
            f"({model.family}, {model.n_layers} layers"
            + (f", {model.n_experts} experts" if model.is_moe else "")
            + ") needs",
        )
    problems = [m for piece in plan for m in expected_shapes(piece, params[piece.lab], shapes)]
    if problems:
        more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
        raise _error(field, "; ".join(problems[:2]) + more)
    used = {name for piece in plan for name in piece.hf}
    if model.tie_embeddings:
        used.add("lm_head.weight")  # tied checkpoints may still store the head
    unused = sorted(k for k in set(shapes) - used if not k.endswith(IGNORED_SUFFIXES))
    if unused:
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        raise _error(
            field,
            f"tensors config.json has no place for: {', '.join(unused[:3])}{more} "
            "(e.g. more experts in the weights than config.json names)",
        )
    return shapes
