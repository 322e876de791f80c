"""Import a local Hugging Face checkpoint folder into the lab's model.

    cfg = resolve_model_source(cfg)                      # shape from config.json
    model = build_model(cfg.model, cfg.model.vocab_size)  # weights streamed in

A checkpoint folder holds ``config.json``, ``model.safetensors`` or shards
listed in ``model.safetensors.index.json``, and optionally tokenizer files.
Weights are read one tensor at a time (``safe_open``, memory-mapped) and
copied straight into the already allocated parameters, which converts to the
run's dtype and device: peak memory is the model plus one tensor, never a
second full copy of the checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from trainer.config import ExperimentConfig, ModelConfig, RopeScalingConfig
from trainer.errors import FieldError
from trainer.hf.families import SHAPE_FIELDS, SOURCE, model_fields_from_hf
from trainer.hf.weights import Piece, weight_plan
from trainer.model.transformer import TransformerLM

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Checkpoint tensors that carry no weights of the model (old rotary caches).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_hf_config(folder: Path) -> dict[str, Any]:
    """The checkpoint's config.json, or a FieldError at model.source saying what is missing."""
    if not folder.is_dir():
        raise FieldError(
            [(SOURCE, f"{folder} is not a folder (use 'builtin' or a checkpoint folder)")]
        )
    path = folder / "config.json"
    if not path.exists():
        raise FieldError(
            [(SOURCE, f"{folder} has no config.json (a Hugging Face checkpoint needs one)")]
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FieldError([(SOURCE, f"{path} is not valid JSON: {exc}")]) from None
    if not isinstance(data, dict):
        raise FieldError([(SOURCE, f"{path} must hold a JSON object")])
    return data


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
    folder = Path(model.source).expanduser().resolve()  # workers may run elsewhere in the tree
    fields = model_fields_from_hf(read_hf_config(folder))
    defaults = ModelConfig()
    errors = []
    for name in SHAPE_FIELDS:
        mine, theirs, default = getattr(model, name), fields[name], getattr(defaults, name)
        if isinstance(mine, RopeScalingConfig):  # a section: compare its values
            mine, default = mine.model_dump(), default.model_dump()
            theirs = RopeScalingConfig.model_validate(theirs).model_dump()
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
    to the model. A handle is therefore dropped (unmapped) after it has served
    ``remap_bytes``, which bounds that extra memory at about ``remap_bytes``
    plus the largest tensor (bench/bench_hf_import.py measures it).
    """

    def __init__(self, folder: Path, remap_bytes: int = 64 * 1024**2):
        self.folder = folder
        self.remap_bytes = remap_bytes
        index = folder / INDEX_FILE
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif (folder / SINGLE_FILE).exists():
            weight_map = None
        else:
            raise FieldError([(SOURCE, f"{folder} has neither {SINGLE_FILE} nor {INDEX_FILE}")])
        self._handles: dict[str, Any] = {}
        self._served: dict[str, int] = {}
        if weight_map is None:
            weight_map = dict.fromkeys(self._handle(SINGLE_FILE).keys(), SINGLE_FILE)
        self.weight_map: dict[str, str] = weight_map

    def _handle(self, file: str):
        if file not in self._handles:
            from safetensors import safe_open

            self._handles[file] = safe_open(str(self.folder / file), framework="pt")
            self._served[file] = 0
        return self._handles[file]

    @property
    def keys(self) -> set[str]:
        return set(self.weight_map)

    def get(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise FieldError([(SOURCE, f"the checkpoint has no tensor {name!r}")])
        file = self.weight_map[name]
        tensor = self._handle(file).get_tensor(name)
        self._served[file] += tensor.numel() * tensor.element_size()
        if self._served[file] >= self.remap_bytes:
            del self._handles[file]  # unmaps: the pages read so far leave the RSS
        return tensor


def _copy_piece(target: torch.Tensor, piece: Piece, reader: CheckpointReader) -> None:
    """Write one plan piece into ``target`` (the lab parameter), checking shapes."""
    if piece.kind == "copy":
        source = reader.get(piece.hf[0])
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
    reader = CheckpointReader(folder)
    plan = weight_plan(cfg, cfg.family, reader.keys)
    params = dict(model.named_parameters())
    for piece in plan:
        _copy_piece(params[piece.lab], piece, reader)
    used = {name for piece in plan for name in piece.hf}
    if cfg.tie_embeddings:
        used.add("lm_head.weight")  # tied checkpoints may still store the head
    unused = sorted(k for k in reader.keys - used if not k.endswith(_IGNORED_SUFFIXES))
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
        for name in params
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
