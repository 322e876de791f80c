"""The one check of a path a user names against ``LAB_ASSET_ROOTS``.

Every path a login can make the server or a worker read goes through
``check_path``: a registered model's or dataset's ``path``, a run config's
``model.source``, ``task.data_file`` and ``task.eval_file`` (at registration,
at submission through the API, the form and ``manage.py submit``, and in the
worker before the trainer opens them), and a run's export folder.

Symlinks and ``..`` are resolved first, so neither leads out. A refusal says
only which folders are allowed: nothing about the path itself (whether it
exists, what it holds), because the check runs before anything opens it.
Files shipped with the lab (``trainer/task_data``) are part of the code, not a
path a user names, and are always allowed. Empty roots allow anything (a
single-machine setup; ``manage.py check --deploy`` warns about it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings

from trainer.errors import FieldError
from trainer.tasks.text_data import SHIPPED_DATA

ROOTS_SETTING = "LAB_ASSET_ROOTS"

# Config fields that name a file or folder the trainer opens: (section, field).
CONFIG_PATH_FIELDS = (("model", "source"), ("task", "data_file"), ("task", "eval_file"))


def default_asset_roots(var_dir: Path) -> list[Path]:
    """``make up``'s roots when the deployment sets none: the lab's shipped data
    and its own var/ folder."""
    return [SHIPPED_DATA.resolve(), Path(var_dir).resolve()]


def asset_roots() -> list[Path]:
    """The configured roots, resolved (empty: no restriction)."""
    return [Path(root).expanduser().resolve() for root in settings.LAB_ASSET_ROOTS]


def _candidate(value: str, *, shipped_names: bool) -> Path:
    """The path ``value`` names, resolved; a relative data-file name is a file in
    ``trainer/task_data`` (as ``trainer.tasks.text_data.resolve_data_file`` reads it)."""
    path = Path(value).expanduser()
    if not path.is_absolute() and shipped_names:
        path = SHIPPED_DATA / path
    return path.resolve()


def is_allowed(value: str, *, shipped_names: bool = False) -> bool:
    roots = asset_roots()
    if not roots:
        return True
    try:
        resolved = _candidate(value, shipped_names=shipped_names)
    except (OSError, ValueError):  # a NUL byte, a symlink loop: never inside
        return False
    allowed = [*roots, SHIPPED_DATA.resolve()] if shipped_names else roots
    return any(resolved.is_relative_to(root) for root in allowed)


def refusal(field: str) -> FieldError:
    """The error for a path outside the roots: it names the roots, never the path's state."""
    allowed = ", ".join(str(root) for root in asset_roots())
    return FieldError([(field, f"must be inside {allowed} ({ROOTS_SETTING})")])


def check_path(field: str, value: str, *, shipped_names: bool = False) -> str:
    """``value`` unchanged when it lies inside the roots; else a FieldError on ``field``.
    ``shipped_names``: a relative name means a file shipped in ``trainer/task_data``."""
    if not is_allowed(value, shipped_names=shipped_names):
        raise refusal(field)
    return value


def check_config_paths(data: Mapping[str, Any], prefix: str = "") -> None:
    """Every path a run config (a nested dict, before validation) names, checked
    before validation opens any of them. Values that are not strings are left to
    the schema's own errors; ``model.source = "builtin"`` is no path."""
    errors: list[tuple[str, str]] = []
    for section, name in CONFIG_PATH_FIELDS:
        part = data.get(section)
        value = part.get(name) if isinstance(part, Mapping) else None
        if not isinstance(value, str) or not value or (section, value) == ("model", "builtin"):
            continue
        field = f"{prefix}{section}.{name}"
        try:
            check_path(field, value, shipped_names=section == "task")
        except FieldError as exc:
            errors += exc.errors
    if errors:
        raise FieldError(errors)
