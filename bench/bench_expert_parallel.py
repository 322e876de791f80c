"""Expert-parallel MoE layer on 1, 2 and 4 gloo CPU ranks (one thread each):
tokens/s of forward+backward and the share of the time spent in all-to-all.

Every rank holds ``--tokens`` tokens (weak scaling: the global batch grows with
the ranks) and E / ranks experts. The all-to-all time is measured by timing the
collectives inside the layer (counts exchange + both row exchanges, forward and
backward).

Timing protocol (bench.common): the rank counts run in paired rounds (each
round launches every rank count once, rotated order); in a launch every rank
times its iterations in wall and process CPU time (gloo's threads included).
Per launch: rank 0's median wall step and the busiest rank's median CPU step;
"tokens/cpu-s" = ranks x tokens / that CPU step is the throughput free cores
would give if no rank waited (on a machine with fewer free cores than ranks the
wall columns measure contention). Ratios to 1 rank are medians over rounds of
the per-round ratio with their 95% order-statistic interval.

    .venv/bin/python -m bench.bench_expert_parallel [--ranks 1 2 4] [--tokens 2048] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as tdist

from bench.common import (
    Rounds,
    Stopwatch,
    Timing,
    print_table,
    ratio_stats,
    round_orders,
    set_threads,
    write_results,
)


def _rank(dist, out_dir: Path, args) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from trainer.model import expert_parallel as ep_mod
    from trainer.model.moe import MoELayer

    set_threads(1)
    torch.manual_seed(0)
    layer = MoELayer(args.d_model, args.experts, 2, args.expert_hidden)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.05)
    world, rank = dist.world_size, dist.rank
    spent = [0.0, 0.0]
    original = tdist.all_to_all_single

    def timed(*a, **kw):
        watch = Stopwatch("process")
        out = original(*a, **kw)
        t = watch.elapsed()
        spent[0] += t.wall
        spent[1] += t.cpu
        return out

    if world > 1:
        ep_mod.dist.all_to_all_single = timed
        module = ep_mod.shard_experts_(layer, rank, world)
    else:
        module = layer
    x = torch.randn(1, args.tokens, args.d_model, generator=torch.Generator().manual_seed(rank))
    walls, cpus, shares, cpu_shares = [], [], [], []
    for i in range(args.warmup + args.repeats):
        xi = x.clone().requires_grad_(True)
        spent[:] = [0.0, 0.0]
        if world > 1:
            tdist.barrier()
        watch = Stopwatch("process")
        y, _ = module(xi)
        y.square().mean().backward()
        step = watch.elapsed()
        if i >= args.warmup:
            walls.append(step.wall)
            cpus.append(step.cpu)
            shares.append(spent[0] / step.wall)
            cpu_shares.append(spent[1] / step.cpu)
    ep_mod.dist.all_to_all_single = original
    med = statistics.median
    torch.save(
        {"wall_s": med(walls), "cpu_s": med(cpus), "a2a_share": med(shares),
         "a2a_cpu_share": med(cpu_shares)},
        out_dir / f"w{world}_r{rank}.pt",
    )  # fmt: skip


def _launch(world: int, out: Path, args) -> dict[str, float]:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from distributed_ranks import run_ranks

    run_ranks(_rank, world, out, args)
    per_rank = [torch.load(out / f"w{world}_r{r}.pt") for r in range(world)]
    return {
        "wall_s": per_rank[0]["wall_s"],
        "cpu_max_s": max(r["cpu_s"] for r in per_rank),
        "a2a_share": per_rank[0]["a2a_share"],
        "a2a_cpu_share": per_rank[0]["a2a_cpu_share"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--expert-hidden", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds of launches")
    args = parser.parse_args(argv)
    set_threads(1)
    names = [f"{w} ranks" for w in args.ranks]
    launches: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    # Timing(wall=rank 0's median step, cpu=the busiest rank's median step CPU)
    timed = Rounds(names, scope="process CPU of the busiest rank")
    with tempfile.TemporaryDirectory() as tmp:
        for order in round_orders(names, args.rounds, "rotate"):
            timed.begin_round(order)
            for name in order:
                res = _launch(args.ranks[names.index(name)], Path(tmp), args)
                launches[name].append(res)
                timed.add(name, Timing(res["wall_s"], res["cpu_max_s"]))
    timed.finish()
    base, w1 = names[0], args.ranks[0]
    rows = []
    for name, world in zip(names, args.ranks, strict=True):
        med = {k: statistics.median(r[k] for r in launches[name]) for k in launches[name][0]}
        # tokens/s of N ranks over tokens/s of the first: (N / N1) x T1 / TN per round
        gain = {
            clock: ratio_stats(
                [t * world for t in timed.samples(base, clock)],
                [t * w1 for t in timed.samples(name, clock)],
            )
            for clock in ("wall", "cpu")
        }
        rows.append(
            {
                "ranks": world,
                "step_wall_ms": round(med["wall_s"] * 1e3, 1),
                "step_cpu_ms": round(med["cpu_max_s"] * 1e3, 1),
                "tokens_per_s": round(world * args.tokens / med["wall_s"]),
                "tokens_per_cpu_s": round(world * args.tokens / med["cpu_max_s"]),
                "gain_wall": str(gain["wall"]),
                "gain_cpu": str(gain["cpu"]),
                "all_to_all_share": round(med["a2a_share"], 3),
                "all_to_all_cpu_share": round(med["a2a_cpu_share"], 3),
            }
        )
    print(timed.load_line())
    print_table(rows, list(rows[0]))
    payload = {"args": vars(args), "rows": rows, "launches": launches, "rounds": timed.record()}
    write_results("expert_parallel", payload)
    return payload


if __name__ == "__main__":
    main()
