"""Hugging Face hub cache layouts resolve offline: a ``models--org--name``
folder or a repo id (looked up in $HF_HUB_CACHE) gives the snapshot that
refs/main names; anything ambiguous or absent is an error naming the folder
to use."""

from __future__ import annotations

import pytest

from trainer.errors import FieldError
from trainer.hf.files import checkpoint_folder


def _cache(root, commits=("abc123",), ref="abc123"):
    repo = root / "models--acme--tiny-moe"
    for commit in commits:
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        (snap / "config.json").write_text("{}")
    if ref:
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(ref)
    return repo


def test_a_cache_folder_resolves_to_the_snapshot_refs_main_names(tmp_path):
    repo = _cache(tmp_path, commits=("old", "abc123"))
    assert checkpoint_folder(str(repo)) == repo / "snapshots" / "abc123"


def test_a_repo_id_resolves_through_the_local_cache(tmp_path, monkeypatch):
    repo = _cache(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert checkpoint_folder("acme/tiny-moe") == (repo / "snapshots" / "abc123").resolve()
    with pytest.raises(FieldError, match="models--acme--other"):
        checkpoint_folder("acme/other")


def test_an_ambiguous_cache_folder_names_the_snapshots(tmp_path):
    repo = _cache(tmp_path, commits=("one", "two"), ref=None)
    with pytest.raises(FieldError) as exc:
        checkpoint_folder(str(repo))
    message = exc.value.errors[0][1]
    assert str(repo / "snapshots" / "one") in message and str(repo / "snapshots" / "two") in message


def test_a_plain_checkpoint_folder_is_itself(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_folder(str(tmp_path)) == tmp_path.resolve()
