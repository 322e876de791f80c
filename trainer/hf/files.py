"""Where a checkpoint's files are and how its small JSON files are read
(torch-free: the validator and the web process use it).

``checkpoint_folder`` turns ``model.source`` into the folder that holds
``config.json``: the folder itself, a Hugging Face hub cache folder
(``models--org--name``, resolved to the snapshot its ``refs/main`` names), or
a repo id (``org/name``) looked up in the local hub cache, offline
(``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``,
as huggingface_hub resolves it). Anything else is a FieldError that names
the folder to use.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from trainer.errors import FieldError

SOURCE = "model.source"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub finds it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _snapshot(repo_folder: Path) -> Path:
    """The snapshot folder of a hub cache repo folder (``models--org--name``)."""
    snapshots = repo_folder / "snapshots"
    found = sorted(p for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []
    ref = repo_folder / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text().strip()
        if (snapshots / commit / "config.json").is_file():
            return snapshots / commit
    with_config = [p for p in found if (p / "config.json").is_file()]
    if len(with_config) == 1:
        return with_config[0]
    if not with_config:
        raise FieldError(
            [
                (
                    SOURCE,
                    f"{repo_folder} is a Hugging Face cache folder without a downloaded "
                    "snapshot holding config.json; download the model again",
                )
            ]
        )
    raise FieldError(
        [
            (
                SOURCE,
                f"{repo_folder} holds {len(with_config)} snapshots and refs/main names none "
                f"of them; set model.source to one of: {', '.join(map(str, with_config))}",
            )
        ]
    )


def checkpoint_folder(source: str) -> Path:
    """The absolute folder holding config.json for ``model.source`` (module docstring)."""
    path = Path(source).expanduser()
    if path.is_dir():
        path = path.resolve()
        if (path / "config.json").is_file() or not (path / "snapshots").is_dir():
            return path
        return _snapshot(path)  # a models--org--name cache folder
    if _REPO_ID.match(source) and not path.exists():
        org, name = source.split("/")
        cached = hub_cache_dir() / f"models--{org}--{name}"
        if cached.is_dir():
            return _snapshot(cached).resolve()
        raise FieldError(
            [
                (
                    SOURCE,
                    f"{source!r} is not a folder, and as a Hugging Face repo id it is not "
                    f"in the local cache ({cached} does not exist); download it first "
                    "(huggingface-cli download) or give the checkpoint folder",
                )
            ]
        )
    raise FieldError([(SOURCE, f"{path} is not a folder (use 'builtin' or a checkpoint folder)")])


def read_json_file(path: Path, field: str = SOURCE) -> Any:
    """A JSON file's content, or a FieldError naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FieldError([(field, f"{path} cannot be read: {exc.strerror or exc}")]) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FieldError([(field, f"{path} is not valid JSON: {exc}")]) from None


def read_hf_config(folder: Path) -> dict[str, Any]:
    """The checkpoint's config.json, or a FieldError at model.source saying what is missing."""
    if not folder.is_dir():
        raise FieldError(
            [(SOURCE, f"{folder} is not a folder (use 'builtin' or a checkpoint folder)")]
        )
    path = folder / "config.json"
    if not path.exists():
        hint = ""
        if (folder / "snapshots").is_dir():
            hint = f"; it is a Hugging Face cache folder: use its snapshot {folder / 'snapshots'}/<commit>"
        raise FieldError(
            [(SOURCE, f"{folder} has no config.json (a Hugging Face checkpoint needs one){hint}")]
        )
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise FieldError([(SOURCE, f"{path} must hold a JSON object")])
    return data


def read_weight_map(index: Path) -> dict[str, str]:
    """The ``weight_map`` of a ``model.safetensors.index.json`` (FieldError if broken)."""
    data = read_json_file(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise FieldError([(SOURCE, f"{index}: weight_map must map tensor names to files")])
    outside = sorted({f for f in weight_map.values() if Path(f).name != f or f in ("", ".", "..")})
    if outside:
        raise FieldError([(SOURCE, f"{index} names {outside[0]!r}, not a file of the folder")])
    return weight_map


# Files read whole into the fingerprint; larger ones (weights) by their size,
# modification time and first and last megabyte (a safetensors header included).
_WHOLE_BYTES = 64 * 1024**2
_EDGE_BYTES = 1024**2


def _file_fingerprint(path: Path, digest) -> None:
    stat = path.stat()
    digest.update(f"{path.name}\0{stat.st_size}\0".encode())
    with path.open("rb") as f:
        if stat.st_size <= _WHOLE_BYTES:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
            return
        digest.update(str(stat.st_mtime_ns).encode())
        digest.update(f.read(_EDGE_BYTES))
        f.seek(-_EDGE_BYTES, os.SEEK_END)
        digest.update(f.read(_EDGE_BYTES))


def content_fingerprint(paths: list[Path]) -> str:
    """A short hash of what ``paths`` hold (a folder: each file in it, sorted), so a
    cache keyed by it is missed when a file changes on disk, not only when its
    path does. Files up to 64 MB are hashed whole (configs, tokenizers, data
    files); a larger one by size, modification time and its first and last
    megabyte (where a safetensors header is): rewriting a checkpoint in place
    changes them, and reading gigabytes of weights on every start does not pay."""
    import hashlib

    digest = hashlib.sha256()
    for path in paths:
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if file.exists():
                _file_fingerprint(file, digest)
            else:
                digest.update(f"{file.name}\0missing".encode())
    return digest.hexdigest()[:16]
