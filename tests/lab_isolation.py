"""Tests never touch the lab's own data (pytest plugin, ``-p lab_isolation`` in
pyproject's addopts, so it loads before pytest-django imports the settings).

1. **A temporary root per session.** Every folder the settings and the trainer
   derive from the checkout or the home folder points under it, in this
   process and in every process the tests start (they inherit the
   environment): ``LAB_VAR_DIR`` (SQLite, the file broker, the secret key,
   static files, logs), ``LAB_RUNS_DIR`` (run folders, their exports),
   ``MOE_LAB_CACHE`` (warm-start bases), ``HF_HOME`` (the Hugging Face cache
   a ``model.source`` name is looked up in) and ``LAB_DEVICE_LOCK_DIR`` (GPU
   leases). Each test then gets its own ``runs/`` (``settings.RUNS_DIR``)
   and ``var/`` for the processes it starts, so run ids that restart (SQLite)
   or do not (PostgreSQL) never meet another test's folder.
2. **A guard over the lab's data**: the checkout's ``var/``, the user's
   warm-start cache (``$MOE_LAB_CACHE``, default ``~/.cache/moe-rl-lab``) and
   the user's own ``LAB_VAR_DIR`` / ``LAB_RUNS_DIR`` if set. The session fails
   when any file there was created, changed, removed or read: snapshots
   before and after, and the audit events of every Python process of the
   session (``tests/data_guard.py``). ``LAB_TEST_GUARD_PATHS`` (os.pathsep
   separated) replaces the guarded folders.

Under pytest-xdist the controller makes the root and takes the snapshots;
its workers (its direct children) reuse the root it exported. While a lab
program outside the session uses a guarded folder (a ``make up`` of this
checkout, a study filling the user's cache), its writes would show in the
snapshots, so only the recorded accesses judge that folder; the controller
looks for such programs at the start, after tests (at most every
``NEIGHBOUR_CHECK_S``) and at the end.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
SITE = Path(__file__).resolve().parent / "isolation_site"
sys.path.insert(0, str(SITE))

import data_guard  # noqa: E402  (needs SITE on the path)
import lab_access_audit  # noqa: E402

ROOT_ENV = "LAB_TEST_ROOT"
SESSION_PID_ENV = "LAB_TEST_SESSION_PID"
GUARD_PATHS_ENV = "LAB_TEST_GUARD_PATHS"
NEIGHBOUR_CHECK_S = 5.0
DEFAULT_CACHE = Path.home() / ".cache" / "moe-rl-lab"  # trainer/run/warmstart.py's default

_session: dict = {
    "controller": False, "before": None, "guarded": [], "lines": [], "shared": {},
    "checked_at": 0.0,
}  # fmt: skip
_per_test = itertools.count()


def _under(path: str, root: str | None) -> bool:
    return bool(root) and os.path.abspath(path).startswith(os.path.abspath(root) + os.sep)


def guarded_paths(env: dict[str, str]) -> list[Path]:
    """The lab's data a session must not touch, from the environment it started in."""
    if env.get(GUARD_PATHS_ENV):
        return [Path(p) for p in env[GUARD_PATHS_ENV].split(os.pathsep) if p]
    if env.get(lab_access_audit.PATHS_ENV):  # a session started by a test: its parent's
        return [Path(p) for p in env[lab_access_audit.PATHS_ENV].split(os.pathsep) if p]
    outer = env.get(ROOT_ENV)
    paths = [CHECKOUT / "var"]
    for name in ("LAB_VAR_DIR", "LAB_RUNS_DIR"):
        if env.get(name) and not _under(env[name], outer):
            paths.append(Path(env[name]))
    cache = env.get("MOE_LAB_CACHE")
    paths.append(Path(cache) if cache and not _under(cache, outer) else DEFAULT_CACHE)
    return list(dict.fromkeys(p.absolute() for p in paths))


def _is_xdist_worker_of_this_session() -> bool:
    """An xdist worker is the controller's direct child; a pytest a test starts is not."""
    pid = os.environ.get(SESSION_PID_ENV, "")
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and pid == str(os.getppid())


def _make_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="moe-lab-tests-"))
    guarded = guarded_paths(dict(os.environ))
    python_path = [str(SITE)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    os.environ.update({
        ROOT_ENV: str(root),
        SESSION_PID_ENV: str(os.getpid()),
        "LAB_VAR_DIR": str(root / "var"),
        "LAB_RUNS_DIR": str(root / "var" / "runs"),
        "MOE_LAB_CACHE": str(root / "cache" / "moe-rl-lab"),
        "HF_HOME": str(root / "cache" / "huggingface"),
        "LAB_DEVICE_LOCK_DIR": str(root / "gpu-locks"),
        lab_access_audit.EVENTS_ENV: str(root / "guard"),
        lab_access_audit.PATHS_ENV: os.pathsep.join(map(str, guarded)),
        # Python children load isolation_site/sitecustomize.py: their accesses are recorded.
        "PYTHONPATH": os.pathsep.join(python_path),
    })  # fmt: skip
    os.environ.pop("HF_HUB_CACHE", None)
    return root


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Before every other plugin's (pytest-django imports the settings in its own)."""
    if not _is_xdist_worker_of_this_session():
        _session["controller"] = True
        _make_root()
        _session["guarded"] = [
            Path(p) for p in os.environ[lab_access_audit.PATHS_ENV].split(os.pathsep)
        ]
        _session["before"] = data_guard.snapshot(_session["guarded"])
        _look_for_neighbours()
    else:
        # Each xdist worker its own var/ and run folders for what outlives one test
        # (module- and session-scoped fixtures, set up before a test's own folders):
        # two workers' stacks would otherwise both write run-000001 (SQLite ids restart).
        worker = Path(os.environ[ROOT_ENV]) / "workers" / os.environ["PYTEST_XDIST_WORKER"]
        os.environ["LAB_VAR_DIR"] = str(worker / "var")
        os.environ["LAB_RUNS_DIR"] = str(worker / "var" / "runs")
    lab_access_audit.install()
    return (yield)


@pytest.fixture(autouse=True)
def _own_lab_folders():
    """This test's run folders (in-process settings) and var/ (for the processes it starts)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = Path(os.environ[ROOT_ENV]) / "tests" / f"{worker}-{next(_per_test):05d}"
    saved = {name: os.environ.get(name) for name in ("LAB_VAR_DIR", "LAB_RUNS_DIR")}
    os.environ["LAB_VAR_DIR"] = str(folder / "var")
    os.environ["LAB_RUNS_DIR"] = str(folder / "var" / "runs")
    settings = _django_settings()
    runs_dir = settings.RUNS_DIR if settings is not None else None
    if settings is not None:
        settings.RUNS_DIR = folder / "var" / "runs"
    try:
        yield folder
    finally:
        if settings is not None:
            settings.RUNS_DIR = runs_dir
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _django_settings():
    """Django's settings when this process configured them (never imports Django)."""
    conf = sys.modules.get("django.conf")
    if conf is None or not conf.settings.configured:
        return None
    return conf.settings


def _look_for_neighbours() -> None:
    """Remember the lab programs outside the session that use a guarded folder."""
    _session["checked_at"] = time.monotonic()
    found = data_guard.lab_processes_using(_session["guarded"], ROOT_ENV)
    for folder, users in found.items():
        _session["shared"].setdefault(folder, set()).update(users)


def pytest_runtest_logreport(report):
    if _session["controller"] and time.monotonic() - _session["checked_at"] > NEIGHBOUR_CHECK_S:
        _look_for_neighbours()


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session, exitstatus):
    """After every other plugin's (xdist stops its workers in its own): judge."""
    result = yield
    if not _session["controller"] or hasattr(session.config, "workerinput"):
        return result
    after = data_guard.snapshot(_session["guarded"])
    _look_for_neighbours()
    differences = [
        (what, path)
        for what, path in data_guard.compare(_session["before"], after)
        if not any(data_guard.inside(path, folder) for folder in _session["shared"])
    ]
    root = Path(os.environ[ROOT_ENV])
    accesses = data_guard.audit_events(root / "guard")
    _session["lines"] = data_guard.report(differences, accesses)
    if _session["lines"]:
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif os.environ.get("LAB_TEST_KEEP_ROOT") != "1":
        shutil.rmtree(root, ignore_errors=True)
    return result


def pytest_terminal_summary(terminalreporter):
    if not _session["controller"]:
        return
    guarded = ", ".join(map(str, _session["guarded"]))
    for folder, users in sorted(_session["shared"].items()):
        terminalreporter.write_line(
            f"lab data guard: {folder} was also used by programs outside the tests, so only "
            "the tests' recorded accesses judge it: " + "; ".join(sorted(users)[:3])
        )
    if not _session["lines"]:
        return
    terminalreporter.section("the tests touched the lab's own data", sep="=", red=True, bold=True)
    terminalreporter.write_line(f"guarded: {guarded}")
    for line in _session["lines"]:
        terminalreporter.write_line(line)
    terminalreporter.write_line(
        "Tests must use their temporary root "
        f"({os.environ.get(ROOT_ENV)}, kept for a look): tests/lab_isolation.py.",
        red=True,
    )


def pytest_report_header(config):
    if _session["controller"]:
        return f"lab data: tests under {os.environ[ROOT_ENV]}; guarded: " + ", ".join(
            map(str, _session["guarded"])
        )
    return None


def pytest_unconfigure(config):
    """The last line says it too: the counts above are of the tests alone."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if _session["controller"] and _session["lines"] and reporter is not None:
        reporter.write_sep(
            "=", "FAILED: the tests touched the lab's own data (see above)", red=True
        )
