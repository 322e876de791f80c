"""Start one attempt's trainer: the run folder prepared, the command line, the
child process.

Why a child process (docs/design.md, "data flow"): GPU memory is released
when the run ends, a crashing run cannot take the worker down, torchrun works
unchanged for several GPUs, and the trainer stays usable without Django.

The child is tied to the worker's life (Linux PR_SET_PDEATHSIG): when the
worker is killed, the trainer dies with it. A worker that is frozen rather
than killed (SIGSTOP, a stuck host) stops renewing the child's lease file, and
the child stops within ``LAB_LEASE_S``, before the reconciler hands the run to
another attempt (``LAB_STALE_AFTER_S``). The child holds the run folder's OS
lock, so a second trainer can never write the same folder (trainer/run_folder/guard.py).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path

from django.conf import settings

from lab.jobs import capacity, gang
from lab.jobs import services as job_services
from lab.jobs.childproc import tied_to_this_process
from lab.jobs.watch import Supervision, ids
from lab.runs.models import Run
from trainer.launch import Rendezvous, launch_command
from trainer.reward_functions import ENV_VAR as REWARD_ENV_VAR
from trainer.run_folder.files import (
    CONFIG_FILE,
    EXIT_CODE_FILE,
    FIELD_ERRORS_FILE,
    LOG_FILE,
    SUMMARY_FILE,
    checkpoint_path,
)
from trainer.run_folder.guard import renew_lease, run_dir_is_locked

log = logging.getLogger("jobs")

REPO_ROOT = Path(settings.BASE_DIR)


def lease_file(run_dir: Path, attempt: int) -> Path:
    """The attempt's lease: one file per attempt, so a later attempt's renewals
    can never keep an earlier attempt's trainer alive."""
    return run_dir / f".lease-attempt-{attempt}"


def trainer_command(
    config_path: Path,
    run_dir: Path,
    *,
    resume: bool,
    gpus: int,
    lease: Path | None = None,
    lease_s: float = 0.0,
    rendezvous: Rendezvous | None = None,
) -> list[str]:
    """``python -m trainer run --config ... --out ... [--resume] [--lease-file ... --lease-s ...]``
    (torchrun for several GPUs; with ``rendezvous``, torchrun as one node of a
    gang: trainer/launch.py builds the launcher)."""
    args = ["-m", "trainer", "run", "--config", str(config_path), "--out", str(run_dir)]
    if resume:
        args.append("--resume")
    if lease is not None:
        args += ["--lease-file", str(lease), "--lease-s", f"{lease_s:g}"]
    return launch_command(args, ranks_per_node=gpus, rendezvous=rendezvous)


def has_checkpoint(run_dir: Path) -> bool:
    # last.pt only: a temporary a killed trainer left behind is no checkpoint.
    return checkpoint_path(run_dir).exists()


def prepare(run: Run, sup: Supervision) -> tuple[Path, list[str]]:
    """Write the run folder's config, drop a previous attempt's summary, renew the
    lease, build the trainer command: (log path, command). OSError
    when the folder cannot be written. A gang member writes its own config
    copy and log (``config.node<k>.json``, ``trainer.node<k>.log``) and leaves
    the summary to its leader."""
    run_dir = sup.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    node = sup.claim.node
    config_path = run_dir / (f"config.node{node}.json" if sup.member else CONFIG_FILE)
    config_path.write_text(json.dumps(run.config, indent=2, sort_keys=True))
    if not sup.member:
        (run_dir / SUMMARY_FILE).unlink(missing_ok=True)  # never read a previous attempt's
        (run_dir / EXIT_CODE_FILE).unlink(missing_ok=True)
        (run_dir / FIELD_ERRORS_FILE).unlink(missing_ok=True)
    sup.lease = lease_file(run_dir, sup.claim.attempt)
    renew_lease(sup.lease)
    cmd = trainer_command(
        config_path,
        run_dir,
        resume=has_checkpoint(run_dir),
        gpus=run.gpus,
        lease=sup.lease,
        lease_s=settings.LAB_LEASE_S,
        rendezvous=gang.rendezvous(run, settings.LAB_GANG_TIMEOUT_S) if run.nodes > 1 else None,
    )
    return run_dir / (f"trainer.node{node}.log" if sup.member else LOG_FILE), cmd


def start(
    cmd: list[str], log_path: Path, sup: Supervision, ranks_per_node: int
) -> subprocess.Popen:
    """Spawn the trainer, its output appended to ``log_path`` after a header
    naming the attempt. OSError when the log cannot be opened."""
    log.info("run %s attempt %s: %s", *ids(sup.claim), " ".join(cmd))
    with open(log_path, "ab") as log_fh:
        log_fh.write(f"\n=== attempt {sup.claim.attempt}: {' '.join(cmd)}\n".encode())
        log_fh.flush()
        return subprocess.Popen(
            tied_to_this_process(cmd),
            cwd=REPO_ROOT,
            env=trainer_env(ranks_per_node),
            stdin=subprocess.DEVNULL,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C reaches the worker only
        )


def trainer_env(ranks_per_node: int) -> dict[str, str]:
    """The trainer's environment: a GPU worker that owns more devices than the
    run needs shows it only the first ``ranks_per_node`` of them; a slot of a shared GPU
    caps it at the slot's share of the memory; the reward functions it may run are
    the lab's list (``LAB_REWARD_MODULES``)."""
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        # The trainer runs only the reward functions this lab offers, whatever the
        # stored config names (a run queued before the list changed included).
        REWARD_ENV_VAR: ",".join(settings.LAB_REWARD_MODULES),
        **capacity.this_worker().trainer_environment(ranks_per_node),
    }


def wait_for_free_folder(sup: Supervision) -> bool:
    """Wait (heartbeating) while an earlier attempt's trainer still holds the run
    folder: a frozen one stops once its lease expires, a killed one at once.
    False when this attempt lost the run meanwhile. After the wait the trainer
    is started anyway: if the folder is still held it exits with
    RUN_DIR_BUSY_EXIT_CODE and the run goes back to the queue."""
    deadline = time.monotonic() + 2 * settings.LAB_STALE_AFTER_S
    waited = False
    while run_dir_is_locked(sup.run_dir) and time.monotonic() < deadline:
        if not waited:
            log.warning("run %s attempt %s: run folder still held; waiting", *ids(sup.claim))
            waited = True
        if not job_services.heartbeat(sup.claim):
            return False
        time.sleep(settings.LAB_POLL_S)
    return True
