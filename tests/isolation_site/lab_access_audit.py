"""Record every file access a Python process of the test session makes under
the lab's own data: the checkout's ``var/`` and the user's warm-start cache.

Installed as an audit hook (PEP 578, ``sys.addaudithook``) in the pytest
processes (``tests/lab_isolation.py``) and, through this folder's
``sitecustomize.py`` on ``PYTHONPATH``, in every Python child they start (web
servers, workers, trainers). Each access under a guarded path is appended as
one JSON line to ``$LAB_TEST_GUARD_EVENTS/events-<pid>.jsonl``; the pytest
controller reads them all at the end of the session (``tests/data_guard.py``).

Standard library only: it runs before anything else in a child.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

EVENTS_ENV = "LAB_TEST_GUARD_EVENTS"  # folder the processes write their events into
PATHS_ENV = "LAB_TEST_GUARDED"  # os.pathsep-separated folders nothing may touch

# Audit events (https://docs.python.org/3/library/audit_events.html) whose
# string arguments are paths. ``open`` is split into read and write by its
# flags; the rest list a folder or change it.
LISTING = frozenset({"os.listdir", "os.scandir", "glob.glob", "glob.glob/2",
                     "pathlib.Path.glob", "pathlib.Path.rglob"})  # fmt: skip
CHANGING = frozenset({
    "os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.truncate", "os.utime", "os.chmod",
    "os.chown", "os.link", "os.symlink", "shutil.copyfile", "shutil.copymode",
    "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.rmtree", "shutil.chown",
})  # fmt: skip
OPENING = frozenset({"open", "sqlite3.connect"})
WATCHED = LISTING | CHANGING | OPENING
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

_state: dict = {"installed": False, "roots": (), "events": None, "fd": None}
_local = threading.local()


def _roots(text: str) -> tuple[str, ...]:
    """Each guarded folder as an absolute and a resolved path (a symlinked home
    or checkout is matched either way)."""
    out: set[str] = set()
    for part in text.split(os.pathsep):
        if part:
            out.add(os.path.abspath(part))
            out.add(os.path.realpath(part))
    return tuple(sorted(out))


def guarded_root(path: object, roots: tuple[str, ...]) -> str | None:
    """The guarded folder ``path`` lies in (or is), else None."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str) or not path:
        return None
    full = os.path.abspath(path)
    for root in roots:
        if full == root or full.startswith(root + os.sep):
            return full
    return None


def _access(event: str, args: tuple) -> str:
    if event == "open" and len(args) >= 3 and isinstance(args[2], int):
        return "write" if args[2] & WRITE_FLAGS else "read"
    if event == "sqlite3.connect":
        return "open database"
    if event in LISTING:
        return "list"
    return event


def _relative_to_a_folder_fd(event: str, args: tuple) -> bool:
    """Whether the event's path is relative to an open folder, not to the working
    directory: ``os.rmdir(name, dir_fd=fd)`` and the like, and the ``os.open(name,
    dir_fd=fd)`` calls inside shutil (``rmtree`` walks a tree by descriptors; its own
    ``shutil.rmtree`` event names the tree). Read against the working directory, a
    temporary tree's ``var`` would look like the checkout's."""
    path = args[0] if args else None
    if not isinstance(path, (str, bytes)) or os.path.isabs(path):
        return False
    if event in CHANGING and len(args) >= 2 and isinstance(args[1], int) and args[1] >= 0:
        return True
    caller = sys._getframe(2)  # this function <- _hook <- the Python caller of the C call
    return os.path.basename(caller.f_code.co_filename) == "shutil.py"


def _hook(event: str, args: tuple) -> None:
    if event not in WATCHED or getattr(_local, "busy", False):
        return
    if _relative_to_a_folder_fd(event, args):
        return
    roots = _state["roots"]
    for arg in args:
        path = guarded_root(arg, roots)
        if path is not None:
            _local.busy = True
            try:
                _record(event, path, _access(event, args))
            finally:
                _local.busy = False
            return


def _record(event: str, path: str, access: str) -> None:
    line = json.dumps({
        "pid": os.getpid(), "argv": sys.argv[:4], "event": event, "access": access,
        "path": path, "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
    })  # fmt: skip
    if _state["fd"] is None:
        os.makedirs(_state["events"], exist_ok=True)
        name = os.path.join(_state["events"], f"events-{os.getpid()}.jsonl")
        _state["fd"] = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(_state["fd"], (line + "\n").encode())


def install(events_dir: str | None = None, guarded: str | None = None) -> bool:
    """Install the hook once per process (the environment's folders by default);
    False when the environment names none."""
    events_dir = events_dir or os.environ.get(EVENTS_ENV)
    guarded = guarded or os.environ.get(PATHS_ENV)
    if not events_dir or not guarded:
        return False
    _state["roots"] = _roots(guarded)
    _state["events"] = events_dir
    if not _state["installed"]:
        _state["installed"] = True
        sys.addaudithook(_hook)  # hooks cannot be removed: one per process
    return True


@contextmanager
def suspended() -> Iterator[None]:
    """The guard's own reads (its snapshots) are not accesses by the tests."""
    previous = getattr(_local, "busy", False)
    _local.busy = True
    try:
        yield
    finally:
        _local.busy = previous
