"""The one builder of torchrun command lines (``python -m torch.distributed.run``).

    python ARGS                                                  one rank
    python -m torch.distributed.run --standalone --nproc_per_node=G ARGS
                                                                 G ranks on this host
    python -m torch.distributed.run --nnodes=N --nproc_per_node=G --rdzv-backend=c10d
        --rdzv-endpoint=HOST:PORT --rdzv-id=ID [--rdzv-conf=join_timeout=S]
        --max-restarts=0 ARGS                                    one node of N hosts

``ARGS`` are the Python arguments torchrun runs on every rank (``-m trainer run
...``). The platform's worker (lab/jobs/spawn.py, a gang's node: lab/jobs/gang.py)
and the benchmarks (bench/bench_data_parallel.py) build their launches here, so
every torchrun the lab starts has the same flags. Torch-free (lists of strings
in and out): the platform imports it (docs/design.md 1.1).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

TORCHRUN = ("-m", "torch.distributed.run")


@dataclass(frozen=True)
class Rendezvous:
    """One node of a launch over several hosts: torchrun's c10d rendezvous.

    Every node of one launch passes the same values; ``run_id`` is new for each
    launch, so a node of an earlier one can never join."""

    nnodes: int
    endpoint: str  # HOST:PORT of the rendezvous store (the first node's agent hosts it)
    run_id: str
    join_timeout_s: float | None = None  # how long the nodes wait for each other


def torchrun_command(
    args: Sequence[str],
    *,
    nproc_per_node: int,
    rendezvous: Rendezvous | None = None,
    python: str | None = None,
) -> list[str]:
    """``python -m torch.distributed.run ... ARGS``: ``--standalone`` on one host,
    or one node of ``rendezvous`` (no restarts: a failed rank ends the launch, and
    whoever started it decides what comes next)."""
    launcher = [python or sys.executable, *TORCHRUN]
    if rendezvous is None:
        return [*launcher, "--standalone", f"--nproc_per_node={nproc_per_node}", *args]
    options = [
        f"--nnodes={rendezvous.nnodes}",
        f"--nproc_per_node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rendezvous.endpoint}",
        f"--rdzv-id={rendezvous.run_id}",
    ]
    if rendezvous.join_timeout_s is not None:
        options.append(f"--rdzv-conf=join_timeout={rendezvous.join_timeout_s:g}")
    return [*launcher, *options, "--max-restarts=0", *args]


def launch_command(
    args: Sequence[str],
    *,
    ranks_per_node: int = 1,
    rendezvous: Rendezvous | None = None,
    python: str | None = None,
) -> list[str]:
    """``python ARGS`` for one rank on one host; torchrun (``torchrun_command``)
    for several ranks or any launch over several hosts."""
    if ranks_per_node > 1 or rendezvous is not None:
        return torchrun_command(
            args, nproc_per_node=ranks_per_node, rendezvous=rendezvous, python=python
        )
    return [python or sys.executable, *args]
