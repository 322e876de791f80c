"""Two trainers never write one run folder: the folder lock, the supervisor's
lease, attempt-unique checkpoint temporaries, and a stop during the warm start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_runner import FAST, ROOT, fast_config

from trainer.run.checkpoint import checkpoint_path, save_checkpoint
from trainer.run.runner import train
from trainer.run_folder.guard import (
    LEASE_EXPIRED_EXIT_CODE,
    RUN_DIR_BUSY_EXIT_CODE,
    Lease,
    LeaseExpired,
    RunDirBusy,
    RunDirLock,
    renew_lease,
    run_dir_is_locked,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _trainer(*args: str, **kw) -> subprocess.Popen:
    overrides = [a for item in FAST for a in ("--set", item)]
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--preset", "moe-grpo", *overrides, *args],
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


def test_second_lock_on_a_folder_is_refused_until_the_first_is_released(tmp_path):
    with RunDirLock(tmp_path):
        assert run_dir_is_locked(tmp_path)
        with pytest.raises(RunDirBusy, match=f"pid {os.getpid()}"):
            RunDirLock(tmp_path).acquire()
    assert not run_dir_is_locked(tmp_path)
    with RunDirLock(tmp_path):  # free again
        pass


def test_cli_on_a_locked_folder_exits_at_once_with_its_own_code(tmp_path):
    out = tmp_path / "run"
    with RunDirLock(out):
        proc = _trainer("--out", str(out))
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == RUN_DIR_BUSY_EXIT_CODE
    assert "is in use by another trainer" in stderr
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def test_lease_expires_when_the_file_is_not_renewed(tmp_path):
    lease_file = tmp_path / "lease"
    renew_lease(lease_file)
    lease = Lease(lease_file, 30)
    lease.check()  # fresh
    old = time.time() - 60
    os.utime(lease_file, (old, old))
    with pytest.raises(LeaseExpired, match="not renewed"):
        lease.check()
    Lease(None, 0).check()  # no supervisor: never expires


def test_expired_lease_stops_the_trainer_without_checkpoint_or_summary(tmp_path):
    lease_file = tmp_path / "lease"
    renew_lease(lease_file)
    old = time.time() - 60
    os.utime(lease_file, (old, old))
    with pytest.raises(LeaseExpired):
        train(fast_config(), tmp_path / "run", lease=Lease(lease_file, 5))
    assert not checkpoint_path(tmp_path / "run").exists()
    assert not (tmp_path / "run" / "summary.json").exists()
    assert not run_dir_is_locked(tmp_path / "run")


@pytest.mark.slow
def test_cli_stops_with_the_lease_code_once_its_supervisor_goes_quiet(tmp_path):
    out, lease_file = tmp_path / "run", tmp_path / "lease"
    renew_lease(lease_file)
    proc = _trainer("--set", "run.steps=500", "--out", str(out),
                    "--lease-file", str(lease_file), "--lease-s", "2")  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "metrics.jsonl").exists():
        renew_lease(lease_file)  # a live supervisor
        time.sleep(0.2)
    stopped_renewing = time.time()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == LEASE_EXPIRED_EXIT_CODE, stderr
    assert "not renewed" in stderr
    assert time.time() - stopped_renewing < 30
    assert not (out / "summary.json").exists()


def test_checkpoint_temporary_is_unique_to_the_writer(tmp_path, monkeypatch):
    """Two writers' temporaries never share a name (pid and host in it), and the
    rename leaves only last.pt."""
    seen: list[Path] = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: (seen.append(Path(f)), real_save(obj, f)))
    save_checkpoint(tmp_path, {"x": 1})
    assert seen and str(os.getpid()) in seen[0].name and seen[0].name.endswith(".tmp")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["last.pt"]


@pytest.mark.slow
def test_sigterm_during_the_warm_start_cancels_within_seconds(tmp_path):
    out = tmp_path / "run"
    # A warm start that never reaches its band on its own (thousands of steps).
    proc = _trainer("--set", "warm_start.max_steps=100000", "--set", "warm_start.eval_every=50000",
                    "--set", "warm_start.target_accuracy_low=0.99",
                    "--set", "warm_start.target_accuracy_high=1.0", "--out", str(out))  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and not run_dir_is_locked(out):
        time.sleep(0.1)
    time.sleep(3)  # inside the warm start's SFT loop by now
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert time.time() - sent < 10
    assert proc.returncode == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "cancelled" and summary["steps"] == 0


def test_torchrun_ranks_other_than_0_share_rank_0s_lock(tmp_path, monkeypatch):
    with RunDirLock(tmp_path):
        monkeypatch.setenv("RANK", "1")
        with RunDirLock(tmp_path):  # same attempt: no second lock taken
            pass
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(RunDirBusy):
            RunDirLock(tmp_path).acquire()


def test_a_rank_dies_with_its_launcher(tmp_path):
    """torchrun's agent killed (its worker died): the rank it started dies too."""
    pid_file = tmp_path / "rank.pid"
    rank = (
        "import os, sys, time; sys.path.insert(0, sys.argv[1]);"
        "from trainer.run_folder.guard import die_with_launcher; die_with_launcher();"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    launcher = (
        "import os, subprocess, sys, time;"
        "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]],"
        " env={**os.environ, 'LOCAL_RANK': '0'}); time.sleep(60)"
    )
    agent = subprocess.Popen([sys.executable, "-c", launcher, rank, str(ROOT)])
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the rank never started"
        time.sleep(0.05)
    rank_pid = int(pid_file.read_text())
    agent.kill()
    agent.wait()
    deadline = time.monotonic() + 10
    while _alive(rank_pid):
        assert time.monotonic() < deadline, "the rank outlived its launcher"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_run_over_several_nodes_needs_torchrun_on_each(tmp_path, monkeypatch):
    from trainer.cli import check_launched_nodes
    from trainer.errors import FieldError

    check_launched_nodes(1, 4)  # one host: the CLI alone is fine
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(FieldError, match=r"run\.nodes: 2 nodes x 1 ranks need torchrun --nnodes=2"):
        check_launched_nodes(2, 1)
    monkeypatch.setenv("WORLD_SIZE", "4")  # what torchrun --nnodes=2 --nproc_per_node=2 sets
    check_launched_nodes(2, 2)


def test_under_torchrun_a_bad_config_leaves_its_exit_code_in_the_run_folder(tmp_path):
    """torchrun exits 1 whatever its ranks said; the rank's code is kept for the worker."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"run": {"steps": "many", "gpus": 2}}))
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "trainer", "run", "--config", str(config), "--out", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1  # torchrun's own
    assert (tmp_path / "run" / "exit_code").read_text() == "2"
    assert "run.steps" in out.stderr
