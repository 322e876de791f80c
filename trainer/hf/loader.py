"""Import a local Hugging Face checkpoint folder into the lab's model.

    cfg = resolve_model_source(cfg)                      # shape from config.json
    model = build_model(cfg.model, cfg.model.vocab_size)  # weights streamed in

A checkpoint folder holds ``config.json``, ``model.safetensors`` or shards
listed in ``model.safetensors.index.json``, and optionally tokenizer files.
Weights are read one tensor at a time (``safe_open``, memory-mapped), each
checked to be a finite float tensor (a NaN, an Inf or an integer dtype is a
field error naming it, before the run trains), and copied straight into the
already allocated parameters, which converts to the
run's dtype and device: peak memory is the model plus one tensor, never a
second full copy of the checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.config import ExperimentConfig, ModelConfig, Section
from trainer.errors import FieldError
from trainer.hf.families import SHAPE_FIELDS, SOURCE, model_fields_from_hf
from trainer.hf.families_routed import mtp_layers
from trainer.hf.files import (
    INDEX_FILE,
    SINGLE_FILE,
    checkpoint_folder,
    read_hf_config,
    read_weight_map,
)
from trainer.hf.validate import ignored_tensor
from trainer.hf.weights import Piece, weight_plan
from trainer.model.transformer import TransformerLM


def resolve_model_source(cfg: ExperimentConfig) -> ExperimentConfig:
    """Fill the model's shape from ``model.source``'s config.json.

    A shape field the config sets to a value other than its default AND other
    than the checkpoint's is a FieldError on that field: the checkpoint decides
    the shape, and a conflicting request is never silently dropped. Idempotent
    (a resolved config, e.g. a run's stored config.json, resolves to itself).
    """
    model = cfg.model
    if model.source == "builtin":
        return cfg
    # workers may run elsewhere in the tree: stored absolute (a hub cache folder or
    # repo id as the snapshot folder it resolves to)
    folder = checkpoint_folder(model.source)
    fields = model_fields_from_hf(read_hf_config(folder))
    defaults = ModelConfig()
    errors = []
    for name in SHAPE_FIELDS:
        mine, theirs, default = getattr(model, name), fields[name], getattr(defaults, name)
        if isinstance(mine, Section):  # a section (rope_scaling, mla, ...): its values
            theirs = type(mine).model_validate(theirs).model_dump()
            mine, default = mine.model_dump(), default.model_dump()
        if mine != default and mine != theirs:
            errors.append(
                (
                    f"model.{name}",
                    f"is {mine!r} but the checkpoint's config.json gives {theirs!r}; with "
                    "model.source set the checkpoint decides the shape: remove this field",
                )
            )
    if errors:
        raise FieldError(errors)
    data = cfg.model_dump()
    data["model"].update(fields)
    data["model"]["source"] = str(folder)
    try:
        return ExperimentConfig.model_validate(data)
    except Exception as exc:  # pydantic ValidationError: report it on the source
        raise FieldError([(SOURCE, f"the checkpoint's shape is out of range: {exc}")]) from None


class CheckpointReader:
    """Tensor name -> tensor over a (sharded) safetensors checkpoint, one tensor at a time.

    ``safe_open`` memory-maps a shard, and every page a read touched stays in
    the process's resident set while the map is open: reading a whole shard
    through one handle would hold a second copy of the checkpoint in RSS next
    to the model. Every open handle is therefore dropped (unmapped) once the
    reader has served ``remap_bytes`` since the last drop, counted over all
    shards together (counted per shard, shards smaller than ``remap_bytes``
    would all stay mapped: 2.06x the checkpoint for 10 shards of 50 MB), and a
    shard's handle is dropped as soon as its last tensor has been read. That
    bounds the extra memory at about ``remap_bytes`` plus the largest tensor
    (bench/bench_hf_import.py measures it, docs/benchmarks.md).
    """

    def __init__(self, folder: Path, remap_bytes: int = 32 * 1024**2):
        self.folder = folder
        self.remap_bytes = remap_bytes
        index = folder / INDEX_FILE
        if index.exists():
            weight_map = read_weight_map(index)
        elif (folder / SINGLE_FILE).exists():
            weight_map = None
        else:
            raise FieldError([(SOURCE, f"{folder} has neither {SINGLE_FILE} nor {INDEX_FILE}")])
        self._handles: dict[str, Any] = {}
        self._served = 0  # bytes served since the handles were last dropped
        if weight_map is None:
            weight_map = dict.fromkeys(self._handle(SINGLE_FILE).keys(), SINGLE_FILE)
        self.weight_map: dict[str, str] = weight_map
        self._unread: dict[str, int] = {}
        for file in weight_map.values():
            self._unread[file] = self._unread.get(file, 0) + 1

    def _handle(self, file: str):
        if file not in self._handles:
            from safetensors import safe_open

            path = self.folder / file
            if not path.is_file():
                raise FieldError([(SOURCE, f"shard {file} is missing from {self.folder}")])
            try:
                self._handles[file] = safe_open(str(path), framework="pt")
            except Exception as exc:  # safetensors' own error kinds for a broken header
                raise FieldError(
                    [(SOURCE, f"{path} is not a readable safetensors file: {exc}")]
                ) from None
        return self._handles[file]

    @property
    def keys(self) -> set[str]:
        return set(self.weight_map)

    def get(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise FieldError([(SOURCE, f"the checkpoint has no tensor {name!r}")])
        file = self.weight_map[name]
        try:
            tensor = self._handle(file).get_tensor(name)
        except FieldError:
            raise
        except Exception as exc:  # a truncated or corrupted data section
            raise FieldError([(SOURCE, f"{file}: tensor {name!r} cannot be read: {exc}")]) from None
        if not tensor.is_floating_point():
            raise FieldError(
                [(SOURCE, f"{file}: tensor {name!r} is stored as {tensor.dtype}, not a float")]
            )
        if not bool(torch.isfinite(tensor).all()):
            raise FieldError([(SOURCE, f"{file}: tensor {name!r} holds NaN or infinite values")])
        self._served += tensor.numel() * tensor.element_size()
        self._unread[file] -= 1
        if self._unread[file] <= 0:
            self._handles.pop(file, None)  # its last tensor: unmap now
        if self._served >= self.remap_bytes:
            self._handles.clear()  # unmaps: the pages read so far leave the RSS
            self._served = 0
        return tensor


def _copy_piece(target: torch.Tensor, piece: Piece, reader: CheckpointReader) -> None:
    """Write one plan piece into ``target`` (the lab parameter), checking shapes."""
    if piece.kind == "copy":
        source = reader.get(piece.hf[0])
        if piece.rows is not None:
            source = source[list(piece.rows)]
    elif piece.kind == "interleaved":  # GPT-OSS gate|up alternating on the last dim
        full = reader.get(piece.hf[0])
        source = full[..., 0::2] if piece.part == "gate" else full[..., 1::2]
    elif piece.kind == "cat":
        source = torch.cat([reader.get(name) for name in piece.hf], dim=0)
    elif piece.kind == "expert":
        source, target = reader.get(piece.hf[0]).t(), target[piece.expert]
    else:  # fused_expert: (E, 2H, D) gate|up or (E, D, H) down, stored (out, in)
        full = reader.get(piece.hf[0])
        if piece.part != "down":
            hidden = full.shape[1] // 2
            full = full[:, :hidden] if piece.part == "gate" else full[:, hidden:]
        source = full.transpose(1, 2)
    if tuple(source.shape) != tuple(target.shape):
        raise FieldError(
            [
                (
                    SOURCE,
                    f"tensor {', '.join(piece.hf)} has shape {tuple(source.shape)} but the model "
                    f"built from config.json expects {tuple(target.shape)} for {piece.lab}",
                )
            ]
        )
    target.copy_(source)


@torch.no_grad()
def load_hf_weights(model: TransformerLM, folder: Path) -> None:
    """Stream a checkpoint's tensors into ``model`` (already on the run's device/dtype).

    Every model weight must come from the checkpoint and every checkpoint
    tensor must be used (a tensor the model has no place for would be an
    ignored part of the architecture).
    """
    cfg = model.cfg
    hf = read_hf_config(folder)
    reader = CheckpointReader(folder)
    plan = weight_plan(cfg, cfg.family, reader.keys, bool(hf.get("rope_interleave", True)))
    # Parameters, and the routers' selection-bias buffers (e_score_correction_bias).
    params = dict(model.named_parameters()) | dict(model.named_buffers())
    for piece in plan:
        _copy_piece(params[piece.lab], piece, reader)
    used = {name for piece in plan for name in piece.hf}
    if cfg.tie_embeddings:
        used.add("lm_head.weight")  # tied checkpoints may still store the head
    mtp = mtp_layers(hf)
    unused = sorted(k for k in reader.keys - used if not ignored_tensor(k, cfg.n_layers, mtp))
    if unused:
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        raise FieldError(
            [
                (
                    SOURCE,
                    f"checkpoint tensors the model has no place for: {', '.join(unused[:5])}{more}",
                )
            ]
        )
    loaded = {piece.lab for piece in plan}
    missing = [
        name
        for name in dict(model.named_parameters())
        if name not in loaded
        and not name.startswith("value_head.")
        and not (cfg.tie_embeddings and name == "lm_head.weight")
        and ".router.noise." not in name
    ]
    if missing:
        raise FieldError([(SOURCE, f"no checkpoint tensor for {', '.join(missing[:5])}")])


def build_model(
    cfg: ModelConfig,
    vocab_size: int,
    value_head: bool = False,
    device: torch.device | str = "cpu",
) -> TransformerLM:
    """The run's model: random init for ``source='builtin'``, else the checkpoint's
    weights (``cfg`` must come from ``resolve_model_source``)."""
    device = torch.device(device)
    if cfg.source == "builtin":
        # Initialised on the CPU generator, then moved: the same weights on every device.
        return TransformerLM(cfg, vocab_size, value_head=value_head).to(device)
    if cfg.family == "builtin":
        raise FieldError([(SOURCE, "resolve the config with resolve_model_source first")])
    with device:  # allocate once, where the run trains; the init is overwritten
        model = TransformerLM(cfg, vocab_size, value_head=value_head)
    load_hf_weights(model, Path(cfg.source))
    return model
