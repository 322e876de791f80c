"""The session guard of tests/lab_isolation.py fails a session whose tests touch
the lab's own data, and stays quiet for one that does not.

Each case runs a small test file in a pytest of its own (a subprocess, so the
leaking tests are never part of the default run) with the plugin loaded and
``LAB_TEST_GUARD_PATHS`` pointing at a stand-in for the checkout's ``var/``
(a filled run folder, as ``make up`` leaves it) and the user's cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each case starts a pytest of its own (2-10 s)

TESTS = Path(__file__).resolve().parent

LEAKS = """
import os, subprocess, sys
from pathlib import Path

VAR, CACHE = (Path(p) for p in os.environ["LAB_TEST_GUARD_PATHS"].split(os.pathsep))
RUN = VAR / "runs" / "run-000001"


def test_reads_a_run_folder_in_process():
    assert (RUN / "metrics.jsonl").read_text()


def test_a_child_process_writes_a_run_folder():
    code = f"open({str(RUN / 'trainer.log')!r}, 'a').write('more')"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_shell_creates_a_cache_entry():
    subprocess.run(["sh", "-c", f"mkdir -p {CACHE / 'warmstart' / 'new'}"], check=True)


def test_a_shell_reads_a_file_nobody_read_since_it_was_written():
    subprocess.run(["cat", str(RUN / "summary.json")], check=True, capture_output=True)
"""

CLEAN = """
import os
import shutil
from pathlib import Path


def test_uses_its_own_folders(tmp_path):
    runs = Path(os.environ["LAB_RUNS_DIR"])
    assert os.environ["LAB_TEST_ROOT"] in str(runs)
    runs.mkdir(parents=True)
    (runs / "run-000001").mkdir()
    assert Path(os.environ["MOE_LAB_CACHE"]).is_relative_to(os.environ["LAB_TEST_ROOT"])


def test_removes_a_temporary_tree_that_holds_a_var_folder(tmp_path, monkeypatch):
    # rmtree walks by folder descriptors: its os.rmdir("var", dir_fd=...) is not ./var
    guarded_var = Path(os.environ["LAB_TEST_GUARD_PATHS"].split(os.pathsep)[0])
    monkeypatch.chdir(guarded_var.parent)  # as the suite runs in the checkout beside var/
    (tmp_path / "stack" / "var" / "runs").mkdir(parents=True)
    shutil.rmtree(tmp_path / "stack")
"""


def _user_data(root: Path) -> tuple[Path, Path]:
    """A stand-in for the checkout's var/ after `make up`, and for the user's cache."""
    var, cache = root / "var", root / "cache"
    run = var / "runs" / "run-000001"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "summary.json").write_text('{"status": "succeeded"}\n')
    (run / "trainer.log").write_text("step 0\n")
    (cache / "warmstart").mkdir(parents=True)
    (cache / "warmstart" / "base.pt").write_bytes(b"weights")
    return var, cache


def _session(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    var, cache = _user_data(tmp_path / "user")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAB_TEST", "PYTEST_"))}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env["LAB_TEST_GUARD_PATHS"] = os.pathsep.join([str(var), str(cache)])
    env["PYTHONPATH"] = str(TESTS)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "lab_isolation", "-p", "no:django",
         "-p", "no:cacheprovider", "test_inner.py", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    "workers",
    [
        pytest.param([], id="one process"),
        pytest.param(["-n", "2"], id="xdist"),
    ],
)
def test_the_guard_fails_a_session_that_touches_the_lab_data(tmp_path, workers):
    done = _session(tmp_path, LEAKS, *workers)
    out = done.stdout
    assert done.returncode == 1, out
    assert "4 passed" in out  # the tests themselves pass: the guard fails the session
    assert "the tests touched the lab's own data" in out
    run = tmp_path / "user" / "var" / "runs" / "run-000001"
    # Python processes record what they did, and which test did it.
    assert f"read     {run / 'metrics.jsonl'}  [test_inner.py::test_reads_a_run_folder" in out
    assert f"write    {run / 'trainer.log'}  [test_inner.py::test_a_child_process" in out
    # The snapshots see what no Python process recorded.
    assert f"created  {tmp_path / 'user' / 'cache' / 'warmstart' / 'new'}" in out
    assert f"changed  {run / 'trainer.log'}" in out
    assert f"read     {run / 'summary.json'}" in out or "noatime" in _mount_options(run)
    assert "FAILED: the tests touched the lab's own data" in out.splitlines()[-1]


def test_a_session_that_keeps_to_its_root_passes_and_cleans_up(tmp_path):
    done = _session(tmp_path, CLEAN)
    assert done.returncode == 0, done.stdout
    assert "2 passed" in done.stdout
    assert "lab's own data" not in done.stdout
    header = next(line for line in done.stdout.splitlines() if line.startswith("lab data:"))
    root = Path(header.split("tests under ", 1)[1].split(";", 1)[0])
    assert not root.exists()  # removed after a clean session


def _mount_options(path: Path) -> str:
    best = ("", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, _, options, *_ = line.split()
        if str(path).startswith(point) and len(point) > len(best[0]):
            best = (point, options)
    return best[1]
