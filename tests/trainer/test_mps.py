"""CUDA MPS for packed runs: the daemon's life, the children's environment, the
fallbacks. The control binary is a stand-in script on PATH that records how it
was called (this machine has no GPU and no MPS); on a GPU host the device
check runs the real one (bench/device_rows/packed.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer.devices import mps
from trainer.devices.mps import LOG_ENV, MPS_ENV, PIPE_ENV, mps_daemon
from trainer.devices.packing import MEMORY_SHARE_ENV


@pytest.fixture
def control(tmp_path, monkeypatch) -> Path:
    """A stand-in ``nvidia-cuda-mps-control`` on PATH; returns its call log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    script = bin_dir / mps.MPS_CONTROL
    script.write_text(
        "#!/bin/sh\n"
        f'echo "args=$* pipe=${PIPE_ENV} log=${LOG_ENV} visible=$CUDA_VISIBLE_DEVICES" >> {log}\n'
        f'if [ -z "$1" ]; then read line; echo "stdin=$line" >> {log}; fi\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(PIPE_ENV, raising=False)
    monkeypatch.delenv(MPS_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    return log


def test_the_daemon_runs_in_its_own_folders_serves_the_block_and_is_stopped(control, monkeypatch):
    monkeypatch.setattr(mps, "_probe", lambda env: None)  # a client ran its kernel
    with mps_daemon("auto", ["0"], 4) as state:
        assert state.active and state.record() == {"active": True, "reason": "lab MPS daemon"}
        pipe = os.environ[PIPE_ENV]
        assert Path(pipe).is_dir() and Path(os.environ[LOG_ENV]).is_dir()
        assert os.environ[MPS_ENV] == "1" and mps.mps_active()
    assert PIPE_ENV not in os.environ and MPS_ENV not in os.environ  # restored
    assert not Path(pipe).exists()  # its temporary folders are gone
    start, stop, quit_line = control.read_text().splitlines()
    # started as a daemon with its own pipe and log folders, for every GPU of the host
    assert start == f"args=-d pipe={pipe} log={Path(pipe).parent / 'log'} visible="
    assert stop.startswith(f"args= pipe={pipe}")  # quit sent to the same daemon
    assert quit_line == "stdin=quit"


def test_a_daemon_no_client_can_use_is_stopped_and_the_block_runs_without_mps(control):
    # the real probe: a Python client that needs CUDA, which this machine lacks
    with mps_daemon("auto", ["0"], 4) as state:
        assert not state.active and "probe client failed" in state.reason
        assert MPS_ENV not in os.environ and PIPE_ENV not in os.environ
    assert [line.split()[0] for line in control.read_text().splitlines()] == [
        "args=-d", "args=", "stdin=quit",
    ]  # fmt: skip
    refused = pytest.raises(RuntimeError, match="mps=on but the MPS daemon started but a probe")
    with refused, mps_daemon("on", ["0"], 4):
        pass


def test_when_mps_is_not_used_it_says_why(control, monkeypatch):
    cases = [
        (("off", ["0"], 4), "mps=off"),
        (("auto", [], 4), "no GPU"),
        (("auto", ["0", "1"], 2), "one process per GPU"),
    ]
    for args, reason in cases:
        with mps_daemon(*args) as state:
            assert not state.active and reason in state.reason
    monkeypatch.setenv(PIPE_ENV, "/tmp/elsewhere")
    with mps_daemon("auto", ["0"], 4) as state:
        assert "already" in state.reason
    monkeypatch.delenv(PIPE_ENV)
    monkeypatch.setenv("PATH", "/nonexistent")
    with mps_daemon("auto", ["0"], 4) as state:
        assert "not on PATH" in state.reason
    with pytest.raises(RuntimeError, match="mps=on but"), mps_daemon("on", ["0"], 4):
        pass
    with pytest.raises(ValueError, match="mps must be"), mps_daemon("sometimes", ["0"], 4):
        pass
    assert not control.exists()  # no daemon was started in any of these


def _environment(_: int) -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", MEMORY_SHARE_ENV, MPS_ENV,
                                           PIPE_ENV)}  # fmt: skip


def test_a_studys_packed_processes_are_mps_clients_with_their_slot(control, monkeypatch):
    from trainer.config import ExperimentConfig
    from trainer.studies import study

    monkeypatch.setattr(mps, "_probe", lambda env: None)
    monkeypatch.setattr(study, "_study_gpus", lambda cfg: ["0"])
    cfg = ExperimentConfig.model_validate({})
    with study._slot_pool(2, cfg, "auto") as (pool, state):
        assert state.active
        seen = pool.map(_environment, range(4), chunksize=1)
    assert {e["CUDA_VISIBLE_DEVICES"] for e in seen} == {"0"}
    assert {e[MEMORY_SHARE_ENV] for e in seen} == {"0.500000"}
    assert {e[MPS_ENV] for e in seen} == {"1"}
    assert all(e[PIPE_ENV] and "moe-lab-mps-" in e[PIPE_ENV] for e in seen)
