"""CUDA MPS for packed runs: one GPU context shared by a study's processes.

Without MPS, the runs packed on one GPU (trainer.devices.packing) time-slice
it: each process has its own CUDA context and the GPU runs one context's
kernels at a time, so small runs whose kernels fill a fraction of the SMs
leave the rest idle. The Multi-Process Service runs the clients' kernels
concurrently through one server (NVIDIA, "Multi-Process Service", the MPS
documentation's "when to use MPS": many small processes on one GPU).

``mps_daemon(mode, gpus)`` starts a control daemon of its own
(``nvidia-cuda-mps-control -d``) with its pipe and log folders under a
temporary folder, so it never touches a daemon of the host's (which uses
/tmp/nvidia-mps), sets ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``
for the processes started inside the block (they connect to it when they
first touch CUDA), and stops it (``quit`` on its control pipe) afterwards.
Before it says "on" it starts one probe client that runs a kernel: a host
where MPS cannot serve (a container without the IPC it needs, a GPU in a
compute mode that forbids it) is recorded as such and the block runs without
MPS instead of failing every run. ``MPS_ENV`` tells a run that it is an MPS
client; its summary.json records it (``device.mps``).

Torch-free at import, like packing: the study process must not create a CUDA
context of its own before its children connect.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_ENV = "MOE_LAB_MPS"  # "1" in a process started under the lab's MPS daemon
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
MODES = ("auto", "on", "off")
# A client's first CUDA call starts the MPS server: seconds, not minutes.
PROBE_TIMEOUT_S = 90.0
_PROBE = "import torch; x = torch.ones(1024, device='cuda'); assert float(x.sum()) == 1024.0"


@dataclass
class MpsState:
    """What a block of packed processes ran under: ``active`` (MPS serves them),
    ``reason`` (why not, when not), the daemon's folders when it ran."""

    active: bool
    reason: str
    pipe_dir: str | None = None
    log_dir: str | None = None
    environment: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, object]:
        return {"active": self.active, "reason": self.reason}


def mps_active() -> bool:
    """Whether this process is a client of the lab's MPS daemon (``MPS_ENV``)."""
    return os.environ.get(MPS_ENV) == "1"


def mps_available() -> bool:
    return shutil.which(MPS_CONTROL) is not None


def _control(env: dict[str, str], *args: str, stdin: str | None = None) -> None:
    subprocess.run(
        [MPS_CONTROL, *args],
        env=env,
        input=stdin,
        text=True,
        check=True,
        capture_output=True,
        timeout=30,
    )


def _probe(env: dict[str, str]) -> str | None:
    """None when a client can run a kernel under the daemon; else why not."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"a probe client did not finish within {PROBE_TIMEOUT_S:.0f} s"
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"a probe client failed: {tail[0][:300]}"
    return None


@contextmanager
def mps_daemon(mode: str, gpus: list[str], processes: int) -> Iterator[MpsState]:
    """Run the block under an MPS daemon of its own when ``mode`` and the host allow.

    mode: ``auto`` (use MPS when the control binary is on PATH, there are GPUs and
    more than one process shares one), ``on`` (the same, but a host without MPS is
    an error), ``off``. gpus: the CUDA_VISIBLE_DEVICES names the processes use;
    processes: how many run at once. The environment is restored afterwards.
    """
    if mode not in MODES:
        raise ValueError(f"mps must be one of {', '.join(MODES)}, not {mode!r}")
    reason = _why_not(mode, gpus, processes)
    if reason is not None:
        if mode == "on":
            raise RuntimeError(f"mps=on but {reason}")
        yield MpsState(False, reason)
        return
    root = tempfile.mkdtemp(prefix="moe-lab-mps-")
    state, control_env = _start(root, gpus)
    saved = {k: os.environ.get(k) for k in state.environment}
    try:
        if mode == "on" and not state.active:
            raise RuntimeError(f"mps=on but {state.reason}")
        os.environ.update(state.environment)
        yield state
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if control_env is not None:
            # a daemon that is already gone needs no quit
            with suppress(OSError, subprocess.SubprocessError):
                _control(control_env, stdin="quit\n")
        shutil.rmtree(root, ignore_errors=True)


def _start(root: str, gpus: list[str]) -> tuple[MpsState, dict[str, str] | None]:
    """Start a daemon with its folders under ``root`` and probe it. Returns the state
    and the environment its control commands need (None when no daemon runs)."""
    pipe_dir, log_dir = os.path.join(root, "pipe"), os.path.join(root, "log")
    os.makedirs(pipe_dir)
    os.makedirs(log_dir)
    variables = {PIPE_ENV: pipe_dir, LOG_ENV: log_dir}
    env = {**os.environ, **variables}
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the server may serve every GPU of the host
    try:
        _control(env, "-d")
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        return MpsState(False, f"the MPS daemon did not start: {str(detail).strip()[:300]}"), None
    problem = _probe({**env, "CUDA_VISIBLE_DEVICES": gpus[0]})
    if problem is not None:
        return MpsState(False, f"the MPS daemon started but {problem}; ran without it"), env
    return MpsState(True, "lab MPS daemon", pipe_dir, log_dir, {**variables, MPS_ENV: "1"}), env


def _why_not(mode: str, gpus: list[str], processes: int) -> str | None:
    if mode == "off":
        return "mps=off"
    if not gpus:
        return "no GPU"
    if processes <= len(gpus):
        return "one process per GPU: nothing to share"
    if os.environ.get(PIPE_ENV):
        return f"{PIPE_ENV} is set: the processes are clients of an MPS daemon already"
    if not mps_available():
        return f"{MPS_CONTROL} is not on PATH"
    return None
