"""The one torchrun command builder (trainer/launch.py): the exact argv for one
rank, several ranks on one host, and one node of a launch over several hosts."""

from __future__ import annotations

import sys

from trainer.launch import Rendezvous, launch_command, torchrun_command

ARGS = ["-m", "trainer", "run", "--config", "c.json", "--out", "run"]


def test_standalone_torchrun_on_one_host():
    assert torchrun_command(ARGS, nproc_per_node=4) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
        *ARGS,
    ]  # fmt: skip


def test_one_node_of_a_multi_host_launch_with_its_rendezvous():
    rdzv = Rendezvous(nnodes=3, endpoint="10.0.0.5:29400", run_id="run7-a2", join_timeout_s=120)
    assert torchrun_command(ARGS, nproc_per_node=2, rendezvous=rdzv, python="/py") == [
        "/py", "-m", "torch.distributed.run",
        "--nnodes=3", "--nproc_per_node=2", "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.5:29400", "--rdzv-id=run7-a2",
        "--rdzv-conf=join_timeout=120", "--max-restarts=0",
        *ARGS,
    ]  # fmt: skip
    no_timeout = Rendezvous(nnodes=2, endpoint="h:1", run_id="x")
    assert not any(
        a.startswith("--rdzv-conf") for a in torchrun_command([], nproc_per_node=1,
                                                              rendezvous=no_timeout)
    )  # fmt: skip


def test_launch_command_uses_torchrun_only_when_it_must():
    assert launch_command(ARGS) == [sys.executable, *ARGS]
    assert launch_command(ARGS, ranks_per_node=1, python="/py") == ["/py", *ARGS]
    assert launch_command(ARGS, ranks_per_node=2) == torchrun_command(ARGS, nproc_per_node=2)
    rdzv = Rendezvous(nnodes=2, endpoint="h:29400", run_id="r")
    # A node of a multi-host launch goes through torchrun even with one rank of its own.
    assert launch_command(ARGS, ranks_per_node=1, rendezvous=rdzv) == torchrun_command(
        ARGS, nproc_per_node=1, rendezvous=rdzv
    )
