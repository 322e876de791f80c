"""Which custom reward functions a run may name (``task.reward_function``), decided
from the name alone: nothing here imports or calls user code.

A reward function is code, so it is trusted code. On the lab's workers an
administrator lists what may run in ``LAB_REWARD_MODULES`` (comma-separated):

* ``package.module`` offers every public function defined in that module
  (one whose ``__module__`` is the module: ``from shutil import rmtree`` inside
  it does not make ``rmtree`` a reward function);
* ``package.module:function`` offers that one function.

The platform refuses any other name when a run is submitted (a field error at
``task.reward_function``); the worker passes the same list to the trainer in
the environment variable of the same name, and the trainer refuses a name
outside it before it starts the function's process
(``trainer.tasks.reward_process``). Without the variable (the trainer run by
hand on one's own machine) any importable function may be named.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

ENV_VAR = "LAB_REWARD_MODULES"
FIELD = "task.reward_function"

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class RewardPath:
    """``package.module:function`` split into its two parts."""

    module: str
    function: str

    def __str__(self) -> str:
        return f"{self.module}:{self.function}"


def parse_reward_path(path: str) -> RewardPath:
    """``"pkg.mod:fn"`` (or ``"pkg.mod.fn"``) -> RewardPath; ValueError saying what is
    wrong. Only identifiers: no file paths, no expressions, no private names."""
    text = path.strip()
    module, sep, function = text.partition(":")
    if not sep:
        module, _, function = text.rpartition(".")
    if not module or not function or not _DOTTED.match(module) or not _NAME.match(function):
        raise ValueError(f"{path!r} is not an import path like 'package.module:function'")
    if function.startswith("_"):
        raise ValueError(f"{path!r}: a private name (leading '_') cannot be a reward function")
    return RewardPath(module, function)


def parse_entries(text: str | None) -> tuple[str, ...]:
    """The entries of a ``LAB_REWARD_MODULES`` value: ``"a.rewards, b.m:score"`` ->
    ``("a.rewards", "b.m:score")``. ValueError naming an entry that is neither form."""
    entries = []
    for raw in (text or "").replace("\n", ",").split(","):
        entry = raw.strip()
        if not entry:
            continue
        if ":" in entry:
            parse_reward_path(entry)
        elif not _DOTTED.match(entry):
            raise ValueError(f"{ENV_VAR}: {entry!r} is neither a module nor module:function")
        entries.append(entry)
    return tuple(entries)


@dataclass(frozen=True)
class Permission:
    """Why a reward path is allowed: by its own entry, or by its module's
    (then only functions defined in that module count)."""

    path: RewardPath
    module_entry: bool


def permit(path: str, entries: tuple[str, ...]) -> Permission:
    """The permission ``entries`` give ``path``, or ValueError saying what the lab offers."""
    parsed = parse_reward_path(path)
    if str(parsed) in entries:
        return Permission(parsed, module_entry=False)
    if parsed.module in entries:
        return Permission(parsed, module_entry=True)
    offered = ", ".join(entries)
    raise ValueError(
        f"{str(parsed)!r} is not a reward function this lab offers"
        + (f" (offered: {offered})" if offered else " (it offers none)")
        + f"; an administrator adds modules to {ENV_VAR} (docs/platform.md, reward functions)"
    )


def environment_entries() -> tuple[str, ...] | None:
    """The allow list the environment sets, or None when it sets none (any name goes)."""
    if ENV_VAR not in os.environ:
        return None
    return parse_entries(os.environ[ENV_VAR])
