"""Expert-parallel MoE layer on 1, 2 and 4 gloo CPU ranks (one thread each):
tokens/s of forward+backward and the share of the time spent in all-to-all.

Every rank holds ``--tokens`` tokens (weak scaling: the global batch grows with
the ranks) and E / ranks experts. The all-to-all time is measured by timing the
collectives inside the layer (counts exchange + both row exchanges, forward and
backward).

    .venv/bin/python -m bench.bench_expert_parallel [--ranks 1 2 4] [--tokens 2048]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as tdist

from bench.common import environment, print_table, write_results


def _rank(dist, out_dir: Path, args) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from trainer.model import expert_parallel as ep_mod
    from trainer.model.moe import MoELayer

    torch.manual_seed(0)
    layer = MoELayer(args.d_model, args.experts, 2, args.expert_hidden)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.05)
    world, rank = dist.world_size, dist.rank
    spent = [0.0]
    original = tdist.all_to_all_single

    def timed(*a, **kw):
        t = time.perf_counter()
        out = original(*a, **kw)
        spent[0] += time.perf_counter() - t
        return out

    if world > 1:
        ep_mod.dist.all_to_all_single = timed
        module = ep_mod.shard_experts_(layer, rank, world)
    else:
        module = layer
    x = torch.randn(1, args.tokens, args.d_model, generator=torch.Generator().manual_seed(rank))
    times, shares = [], []
    for i in range(args.warmup + args.repeats):
        xi = x.clone().requires_grad_(True)
        spent[0] = 0.0
        if world > 1:
            tdist.barrier()
        t0 = time.perf_counter()
        y, _ = module(xi)
        y.square().mean().backward()
        elapsed = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(elapsed)
            shares.append(spent[0] / elapsed)
    ep_mod.dist.all_to_all_single = original
    if rank == 0:
        med = statistics.median(times)
        torch.save(
            {"step_s": med, "a2a_share": statistics.median(shares)}, out_dir / f"w{world}.pt"
        )


def main(argv: list[str] | None = None) -> dict:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from distributed_ranks import run_ranks

    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--expert-hidden", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in args.ranks:
            run_ranks(_rank, world, Path(tmp), args)
            res = torch.load(Path(tmp) / f"w{world}.pt")
            rows.append(
                {
                    "ranks": world,
                    "tokens_per_s": round(world * args.tokens / res["step_s"]),
                    "step_ms": round(res["step_s"] * 1e3, 1),
                    "all_to_all_share": round(res["a2a_share"], 3),
                }
            )
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup"] = round(row["tokens_per_s"] / base, 2)
    print_table(rows, list(rows[0]))
    payload = {"args": vars(args), "rows": rows, "environment": environment()}
    write_results("expert_parallel", payload)
    return payload


if __name__ == "__main__":
    main()
