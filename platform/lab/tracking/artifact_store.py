"""Where artifact files live: a local folder (the default, ``LAB_VAR_DIR/artifacts``)
or S3-compatible object storage (the team stack's MinIO, AWS S3), chosen by
``LAB_ARTIFACT_STORE`` (``file:///path`` or ``s3://bucket/prefix``). Paths are
MLflow's artifact paths, ``<experiment>/<run>/artifacts/<file>`` and
``<experiment>/models/<model>/artifacts/<file>`` (tracking/artifacts.py decides
who may touch which); both stores take the same relative, normalised path
(``clean_path``: no ``..``, no absolute path, no NUL).

An upload is streamed, never held in memory, and bounded: past ``limit`` bytes
it stops and nothing is kept (``TooLarge``). A local file appears whole or not
at all (written under a hidden name, then renamed).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import urlparse

CHUNK = 1024 * 1024


class TooLarge(Exception):
    """The upload passed the size limit; nothing was stored."""


class BadPath(Exception):
    """Not a path inside the store."""


@dataclass(frozen=True)
class Entry:
    """A listed artifact: its path relative to the store's root, folder or file."""

    path: str
    is_dir: bool
    size: int | None


def clean_path(path: str) -> str:
    """``path`` relative and normalised ('' for the root); BadPath for '..', an
    absolute path, a backslash or a control character."""
    if any(ord(c) < 32 for c in path) or "\\" in path:
        raise BadPath(f"invalid artifact path {path!r}")
    if path.startswith("/"):
        raise BadPath(f"artifact paths are relative: {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise BadPath(f"artifact paths may not leave their folder: {path!r}")
    return "/".join(parts)


class ArtifactStore(Protocol):
    def put(self, path: str, stream: BinaryIO, length: int, limit: int) -> int: ...

    def open(self, path: str) -> tuple[Iterator[bytes], int] | None: ...

    def list(self, path: str) -> list[Entry]: ...

    def walk(self, path: str) -> list[Entry]: ...

    def delete(self, path: str) -> None: ...


def _copy_bounded(stream: BinaryIO, out: BinaryIO, length: int, limit: int) -> int:
    if length > limit:
        raise TooLarge(f"{length} bytes; the limit is {limit} (LAB_MAX_ARTIFACT_BYTES)")
    written = 0
    while written < length:
        chunk = stream.read(min(CHUNK, length - written))
        if not chunk:
            break
        written += len(chunk)
        out.write(chunk)
    if written != length:
        raise BadPath(f"the upload ended after {written} of {length} bytes")
    return written


class LocalStore:
    """Files under one folder."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _file(self, path: str) -> Path:
        return self.root / clean_path(path) if clean_path(path) else self.root

    def put(self, path: str, stream: BinaryIO, length: int, limit: int) -> int:
        target = self._file(path)
        if not clean_path(path):
            raise BadPath("an upload needs a file name")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            raise BadPath(f"{path} is a folder")
        fd, tmp = tempfile.mkstemp(prefix=".upload-", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                written = _copy_bounded(stream, out, length, limit)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return written

    def open(self, path: str) -> tuple[Iterator[bytes], int] | None:
        target = self._file(path)
        if not target.is_file():
            return None
        size = target.stat().st_size

        def chunks() -> Iterator[bytes]:
            with target.open("rb") as f:
                while block := f.read(CHUNK):
                    yield block

        return chunks(), size

    def list(self, path: str) -> list[Entry]:
        folder = self._file(path)
        if not folder.is_dir():
            return []
        base = clean_path(path)
        out = []
        for child in sorted(folder.iterdir(), key=lambda p: p.name):
            if child.name.startswith(".upload-"):
                continue
            rel = posixpath.join(base, child.name) if base else child.name
            out.append(Entry(rel, child.is_dir(), None if child.is_dir() else child.stat().st_size))
        return out

    def walk(self, path: str) -> list[Entry]:
        """Every file under ``path`` (a file: itself), in path order."""
        target = self._file(path)
        if target.is_file():
            return [Entry(clean_path(path), False, target.stat().st_size)]
        out = []
        for entry in self.list(path):
            out += self.walk(entry.path) if entry.is_dir else [entry]
        return out

    def delete(self, path: str) -> None:
        target = self._file(path)
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


class S3Store:
    """Objects under ``prefix`` in one bucket of an S3-compatible service (boto3; the
    endpoint ``LAB_S3_ENDPOINT_URL`` for MinIO or another S3-compatible server,
    credentials from the usual AWS variables)."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None):
        import boto3

        self.bucket = bucket
        self.prefix = clean_path(prefix)
        self.client = boto3.client("s3", endpoint_url=endpoint_url or None)

    def _key(self, path: str) -> str:
        path = clean_path(path)
        return "/".join(p for p in (self.prefix, path) if p)

    def _rel(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def put(self, path: str, stream: BinaryIO, length: int, limit: int) -> int:
        if not clean_path(path):
            raise BadPath("an upload needs a file name")
        with tempfile.SpooledTemporaryFile(max_size=8 * CHUNK) as spool:
            written = _copy_bounded(stream, spool, length, limit)
            spool.seek(0)
            self.client.upload_fileobj(spool, self.bucket, self._key(path))
        return written

    def open(self, path: str) -> tuple[Iterator[bytes], int] | None:
        from botocore.exceptions import ClientError

        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(path))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        body = answer["Body"]
        return body.iter_chunks(CHUNK), int(answer["ContentLength"])

    def list(self, path: str) -> list[Entry]:
        prefix = self._key(path)
        prefix = f"{prefix}/" if prefix else ""
        out: list[Entry] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                out.append(Entry(self._rel(common["Prefix"].rstrip("/")), True, None))
            for obj in page.get("Contents", []):
                if obj["Key"] != prefix:
                    out.append(Entry(self._rel(obj["Key"]), False, int(obj["Size"])))
        return sorted(out, key=lambda e: e.path)

    def walk(self, path: str) -> list[Entry]:
        key = self._key(path)
        opened = self.open(path) if clean_path(path) else None
        if opened is not None:
            return [Entry(clean_path(path), False, opened[1])]
        prefix = f"{key}/" if key else ""
        out = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            out += [
                Entry(self._rel(o["Key"]), False, int(o["Size"])) for o in page.get("Contents", [])
            ]
        return sorted(out, key=lambda e: e.path)

    def delete(self, path: str) -> None:
        keys = [self._key(e.path) for e in self.walk(path)]
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]}
            )


def store_from_url(url: str, default_root: Path, endpoint_url: str = "") -> ArtifactStore:
    """The store ``LAB_ARTIFACT_STORE`` names: ``''`` -> ``default_root``; ``file:///path``
    or a plain path; ``s3://bucket/prefix`` (at ``endpoint_url``, else AWS)."""
    if not url:
        return LocalStore(default_root)
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"LAB_ARTIFACT_STORE: {url!r} names no bucket")
        return S3Store(parsed.netloc, parsed.path.lstrip("/"), endpoint_url or None)
    if parsed.scheme in ("file", ""):
        return LocalStore(Path(parsed.path if parsed.scheme else url))
    raise ValueError(f"LAB_ARTIFACT_STORE: {url!r} is neither file:// nor s3://")


_stores: dict[str, ArtifactStore] = {}


def artifact_store() -> ArtifactStore:
    """The deployment's store (settings LAB_ARTIFACT_STORE), made once per process
    and setting."""
    from django.conf import settings

    url, endpoint = settings.LAB_ARTIFACT_STORE, settings.LAB_S3_ENDPOINT_URL
    key = f"{url}|{endpoint}|{settings.VAR_DIR}"
    if key not in _stores:
        _stores[key] = store_from_url(url, Path(settings.VAR_DIR) / "artifacts", endpoint)
    return _stores[key]
