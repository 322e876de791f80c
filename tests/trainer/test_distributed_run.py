"""A run started by torchrun with 2 gloo ranks on the CPU, end to end: rank 0
alone writes the run folder, SIGTERM reaches every rank (finish the step,
checkpoint once, status cancelled), a resume continues the same run (every
rank's RNG restored) and a resume with another world size fails clearly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_runner import FAST as RUNNER_FAST
from test_runner import ROOT

from trainer.run_folder.files import read_metrics

# The runner tests' fast config, run a little longer (6 steps) with no checkpoint
# before the end; later overrides win.
FAST = [*RUNNER_FAST, "run.steps=6", "run.eval_every=3", "run.checkpoint_every=100"]


def _command(out: Path, ranks: int, strategy: str, *extra: str, ep: int = 1) -> list[str]:
    items = [*FAST, f"run.gpus={ranks}", f"parallel.strategy={strategy}",
             f"parallel.expert_parallel={ep if ranks > 1 else 1}"]  # fmt: skip
    sets = [a for item in items for a in ("--set", item)]
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    args = ["-m", "trainer", "run", "--preset", "moe-grpo", *sets, "--out", str(out), *extra]
    return [sys.executable, *(launcher if ranks > 1 else []), *args]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "MOE_LAB_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}  # fmt: skip


def _comparable(rows: list[dict]) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in rows
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "ep"), [("ddp", 1), ("fsdp", 1), ("ddp", 2), ("fsdp", 2)])
def test_two_ranks_cancel_resume_and_world_size_check(tmp_path, strategy, ep):
    env = _env(tmp_path)
    straight = tmp_path / "straight"
    done = subprocess.run(_command(straight, 2, strategy, ep=ep), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # One summary on stdout and one metrics line per step: rank 0 alone writes.
    assert done.stdout.count('"status"') == 1
    rows = read_metrics(straight)
    assert [r["step"] for r in rows] == list(range(6))
    assert rows[0]["optim/batch_size"] == 16.0  # the global batch, not a rank's share
    assert json.loads((straight / "summary.json").read_text())["status"] == "succeeded"
    # The checkpoint exports in one process, sharded (FSDP) or not.
    export = subprocess.run(
        [sys.executable, "-m", "trainer", "export", str(straight), "--step", "6",
         "--out", str(tmp_path / "export")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr[-2000:]
    assert (tmp_path / "export" / "model.safetensors").exists()

    # SIGTERM to torchrun reaches both ranks: they agree to stop after the same step.
    cut = tmp_path / "cut"
    proc = subprocess.Popen(_command(cut, 2, strategy, ep=ep), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 240
    while time.time() < deadline and len(read_metrics(cut)) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=180)
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["status"] == "cancelled"
    assert summary["steps"] == len(read_metrics(cut)) < 6
    assert (cut / "checkpoints" / "last.pt").exists()

    # Another world size: a clear error, nothing trained.
    other = subprocess.run(_command(cut, 1, strategy, "--resume"), cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert other.returncode != 0
    assert "written by 2 rank(s)" in other.stderr and "run.gpus=2" in other.stderr

    # The same world size continues the same run: identical metrics to the straight one.
    resumed = subprocess.run(_command(cut, 2, strategy, "--resume", ep=ep), cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _comparable(read_metrics(cut)) == _comparable(rows)


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_run_with_a_clear_error(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _command(out, 2, "ddp", "--set", "run.steps=500", "--set", "parallel.timeout_s=20"),
        cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 240
    while time.time() < deadline and len(read_metrics(out)) < 2:
        time.sleep(0.2)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    rank1 = [
        pid for pid in children.stdout.split()
        if b"\0RANK=1\0" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    ]  # fmt: skip
    os.kill(int(rank1[0]), signal.SIGKILL)
    t0 = time.time()
    proc.communicate(timeout=120)
    assert proc.returncode != 0 and time.time() - t0 < 60  # no hang
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "another rank of this 2-rank run died or stopped answering" in summary["error"]
