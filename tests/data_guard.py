"""The session guard's evidence: what the test session did to the lab's own data.

Two kinds, because neither sees everything alone:

* **snapshots** of every guarded folder before and after the session (each
  entry's kind, size, inode, mtime and ctime, a file's atime): a file created,
  removed, changed or read by any process, Python or not. Reads show only when
  the filesystem updates atimes (``relatime``: a file's first read after it was
  written, or a day after its last read; never under ``noatime``);
* **audit events** written by every Python process of the session
  (``isolation_site/lab_access_audit.py``): each open, listing or change of a
  guarded path, with the process and the test that made it, whatever the mount
  options.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from lab_access_audit import suspended

Entry = tuple  # (kind, size, inode, mtime_ns, ctime_ns, atime_ns or 0)


def snapshot(roots: list[Path]) -> dict[str, Entry]:
    """Every entry under ``roots`` (the roots included), without following links."""
    out: dict[str, Entry] = {}
    with suspended():
        for root in roots:
            _add(out, str(root))
            for folder, dirs, files in os.walk(root):
                for name in dirs + files:
                    _add(out, os.path.join(folder, name))
    return out


def _add(out: dict[str, Entry], path: str) -> None:
    try:
        st = os.lstat(path)
    except OSError:
        return
    is_file = stat.S_ISREG(st.st_mode)
    kind = "file" if is_file else "dir" if stat.S_ISDIR(st.st_mode) else "other"
    # A folder's atime moves when anyone lists it, the guard included: files only.
    atime = st.st_atime_ns if is_file else 0
    out[path] = (kind, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, atime)


def compare(before: dict[str, Entry], after: dict[str, Entry]) -> list[tuple[str, str]]:
    """(what, path) for each entry created, removed, changed or read between the snapshots."""
    out = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        if old is None:
            out.append(("created", path))
        elif new is None:
            out.append(("removed", path))
        elif old[:5] != new[:5]:
            out.append(("changed", path))
        else:
            out.append(("read", path))  # only its access time moved
    return out


def inside(path: str, folder: Path) -> bool:
    folder_text = os.path.abspath(folder)
    return path == folder_text or path.startswith(folder_text + os.sep)


@dataclass
class Access:
    access: str
    path: str
    test: str
    argv: list[str]

    def line(self) -> str:
        who = self.test or " ".join(self.argv)[:120] or "?"
        return f"{self.access:<8} {self.path}  [{who}]"


def audit_events(events_dir: Path) -> list[Access]:
    """The accesses every process of the session recorded, in no particular order."""
    out = []
    with suspended():
        for file in sorted(events_dir.glob("events-*.jsonl")):
            for raw in file.read_text(errors="replace").splitlines():
                try:
                    item = json.loads(raw)
                except ValueError:
                    continue  # a line cut short by a killed process
                out.append(Access(item["access"], item["path"], item["test"], item["argv"]))
    return out


def report(
    differences: list[tuple[str, str]], accesses: list[Access], limit: int = 40
) -> list[str]:
    """The lines the session prints when it touched the lab's data."""
    snapshot_lines = [f"{what:<8} {path}" for what, path in differences]
    lines = []
    if accesses:
        seen = sorted({a.line() for a in accesses})
        lines.append(f"{len(seen)} access(es) by the session's Python processes:")
        lines += ["  " + text for text in seen[:limit]]
        if len(seen) > limit:
            lines.append(f"  ... and {len(seen) - limit} more")
    if snapshot_lines:
        lines.append(f"{len(snapshot_lines)} difference(s) between the snapshots:")
        lines += ["  " + text for text in snapshot_lines[:limit]]
        if len(snapshot_lines) > limit:
            lines.append(f"  ... and {len(snapshot_lines) - limit} more")
    return lines


def is_lab_program(argv: list[bytes]) -> bool:
    """The lab's own programs: ``python -m trainer``, ``manage.py`` (lab_up, submit,
    ...), Celery and gunicorn serving lab.site, ``python -m bench.*``, and the
    pool processes a study starts (multiprocessing's spawn and forkserver
    children, whose command line does not name their program)."""
    for i, arg in enumerate(argv):
        if b"multiprocessing" in arg and (b"spawn_main" in arg or b"forkserver" in arg):
            return True
        module = argv[i - 1] == b"-m" if i else False
        if module and (arg in (b"trainer", b"celery", b"gunicorn") or arg.startswith(b"bench.")):
            return True
        if arg.endswith((b"manage.py", b"/celery", b"/gunicorn", b"/torchrun")):
            return True
    return False


def lab_processes_using(guarded: list[Path], session_env: str) -> dict[Path, set[str]]:
    """Processes outside any test session (no ``session_env`` in their environment)
    that run a lab program over a guarded folder: ``make up`` of this checkout,
    a study or a run writing the user's cache. Their writes would show in the
    snapshots, so those folders are judged by the recorded accesses alone.
    Linux (/proc); elsewhere nothing is found."""
    found: dict[Path, set[str]] = {}
    with suspended():
        try:
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return found
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
                if int(pid) == os.getpid() or not is_lab_program(argv):
                    continue
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    pairs = [item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item]
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:  # gone, or another user's
                continue
            env = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
            if session_env in env:
                continue
            home = env.get("HOME") or os.path.expanduser("~")
            var = env.get("LAB_VAR_DIR") or os.path.join(cwd, "var")
            uses = [
                env.get("MOE_LAB_CACHE") or os.path.join(home, ".cache", "moe-rl-lab"),
                var,
                env.get("LAB_RUNS_DIR") or os.path.join(var, "runs"),
            ]
            what = " ".join(a.decode(errors="replace") for a in argv if a)[:100]
            for folder in guarded:
                if any(inside(os.path.abspath(os.path.join(cwd, u)), folder) for u in uses):
                    found.setdefault(folder, set()).add(f"pid {pid}: {what}")
    return found
