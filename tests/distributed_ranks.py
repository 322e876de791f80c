"""Run a function on W gloo ranks on the CPU, as torchrun would start them.

``run_ranks(fn, world, out_dir, *args)`` spawns ``world`` processes; each one sets
torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
joins the process group through the trainer's own ``init_distributed`` and calls
``fn(dist, out_dir, *args)``. A rank that raises makes ``run_ranks`` raise.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.multiprocessing as mp

from trainer.distributed import SINGLE, init_distributed, shutdown_distributed


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, strategy: str, ep: int, fn, out_dir, args) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
    )
    torch.set_num_threads(1)
    dist = init_distributed(world, torch.device("cpu"), strategy, 60.0, expert_parallel=ep)
    finished = False
    try:
        fn(dist, out_dir, *args)
        finished = True
    finally:
        shutdown_distributed(dist, in_step=finished)
    # The rank's results are in out_dir and its group is destroyed: leave without
    # the interpreter's finalisation, where torch's C++ threads have aborted a
    # finished rank (SIGABRT) and failed a test whose numbers were all written.
    # The trainer's own exit is tested through torchrun (test_distributed_run).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(
    fn: Callable[..., None],
    world: int,
    out_dir: Path,
    *args,
    strategy: str = "ddp",
    expert_parallel: int = 1,
) -> None:
    """``fn(dist, out_dir, *args)`` on ``world`` ranks (``world == 1``: in this process)."""
    if world == 1:
        fn(SINGLE, out_dir, *args)
        return
    # A fork server that has imported torch and the trainer forks each rank: a
    # spawned rank paid a fresh interpreter's imports (2-3 s of CPU) before its
    # first step. The server starts once per test process and imports but never
    # runs torch (no thread pools to fork), so its forks are clean.
    mp.set_forkserver_preload(["distributed_ranks", "trainer.run.update", "trainer.hf"])
    mp.start_processes(
        _rank_main,
        args=(world, free_port(), strategy, expert_parallel, fn, out_dir, args),
        nprocs=world,
        join=True,
        start_method="forkserver",
    )
