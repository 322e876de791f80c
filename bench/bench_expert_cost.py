"""Where the extra RL-step cost of many experts goes, in CPU time.

At fixed active parameters (bench/bench_active_params.py) a 64-expert step
costs more than an 8-expert one. Three parts are measured here, all in the
SAME paired rounds as the two steps (bench.common: every item once per round,
seeded random order; wall and thread CPU time), so that one round's load hits
every part alike:

* step: one whole RL step ("after": the fused AdamW the trainer builds);
* floor: what follows the TOTAL parameter count at any batch size, per
  minibatch: one fused AdamW step ("adam"), the global clipping norm ("clip"),
  a fresh gradient buffer for every parameter ("grads": the backward writes
  each expert's full gradient, zeros included), each timed on its own;
* gemm: every ``grouped_mm`` call the step made (recorded in one step: shapes,
  expert offsets, whether it needed a gradient), replayed alone, forward and,
  where the step trained, backward. torch's CPU grouped_mm runs one GEMM per
  expert, so this is the per-expert GEMM loop.

The decomposition is the median over rounds of each part's 64-vs-8 difference,
and the median over rounds of its share of the step's difference (also the
ratio of the two medians, "share_of_medians"). The floor's
"grads" and the GEMM backward's weight-gradient writes overlap (both fill
expert-sized gradient buffers), so floor + gemm may count that part twice.

A second table: one optimiser step over every parameter of the largest model,
torch's per-tensor loop (its CPU default) vs foreach vs fused, in paired rounds.

    .venv/bin/python -m bench.bench_expert_cost [--experts 8 64] [--layers 2] [--rounds 9]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch

from bench.bench_active_params import Step, add_step_args
from bench.common import (
    Rounds,
    median_interval,
    print_table,
    ratio_stats,
    run_rounds,
    set_threads,
    write_results,
)
from trainer.model import dispatch as dispatch_mod

FLOOR_PARTS = ("adam", "clip", "grads")


def floor_fns(policy: torch.nn.Module, minibatches: int) -> dict[str, Callable[[], None]]:
    """The floor under what more experts cost, per part, each for all minibatches:
    one fused AdamW step, one global-norm clip, fresh gradient buffers for every
    parameter."""
    params = [p.detach().clone().requires_grad_(True) for p in policy.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-6, fused=True)

    def adam() -> None:
        for _ in range(minibatches):
            optimizer.step()

    def clip() -> None:
        for _ in range(minibatches):
            torch.nn.utils.clip_grad_norm_(params, 1.0)

    def grads() -> None:
        for _ in range(minibatches):
            for p in params:
                p.grad = torch.zeros_like(p)

    return {"adam": adam, "clip": clip, "grads": grads}


def record_grouped_mm(step: Step) -> list[tuple]:
    """(x shape, w shape, offsets, needs grad) of every grouped_mm call of one step."""
    calls: list[tuple] = []
    original = dispatch_mod._grouped_mm

    def recording(x, w, *args, offs=None, **kwargs):
        grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
        calls.append((tuple(x.shape), tuple(w.shape), offs.clone(), x.dtype, grad))
        return original(x, w, *args, offs=offs, **kwargs)

    dispatch_mod._grouped_mm = recording
    try:
        step.run()
    finally:
        dispatch_mod._grouped_mm = original
    for part in step.parts.values():
        part.pop()  # the recorded step is not a sample
    return calls


def gemm_fn(calls: list[tuple]):
    """Replays the recorded grouped_mm calls: forward, and backward where the step trained."""
    gen = torch.Generator().manual_seed(0)
    operands = []
    for x_shape, w_shape, offs, dtype, grad in calls:
        x = torch.randn(x_shape, generator=gen, dtype=dtype).requires_grad_(grad)
        w = torch.randn(w_shape, generator=gen, dtype=dtype).requires_grad_(grad)
        g = torch.randn((x_shape[0], w_shape[-1]), generator=gen, dtype=dtype) if grad else None
        operands.append((x, w, offs, g))

    def run() -> None:
        for x, w, offs, g in operands:
            if g is None:
                with torch.no_grad():
                    dispatch_mod._grouped_mm(x, w, offs=offs)
            else:
                x.grad = w.grad = None
                dispatch_mod._grouped_mm(x, w, offs=offs).backward(g)

    return run


def series(timed: Rounds, part: str, e: int, clock: str) -> list[float]:
    """Per round, seconds of ``part`` at ``e`` experts ("floor": its three parts summed)."""
    if part != "floor":
        return timed.samples(f"{part} E{e}", clock)
    parts = [timed.samples(f"{p} E{e}", clock) for p in FLOOR_PARTS]
    return [sum(values) for values in zip(*parts, strict=True)]


def _ms(values: list[float]) -> str:
    lo, hi, _ = median_interval(values)
    return f"{statistics.median(values) * 1e3:.1f} [{lo * 1e3:.1f}, {hi * 1e3:.1f}]"


def decomposition(timed: Rounds, low: int, high: int, clock: str) -> list[dict[str, object]]:
    """Per part: medians at both expert counts, the median per-round difference
    and its share of the step's difference, with 95% order-statistic intervals."""

    def extra(part: str) -> list[float]:
        a, b = series(timed, part, high, clock), series(timed, part, low, clock)
        return [x - y for x, y in zip(a, b, strict=True)]

    step = extra("step")
    rows = []
    for part in ("step", "floor", *FLOOR_PARTS, "gemm"):
        d = extra(part)
        rows.append(
            {
                "clock": clock,
                "part": f"  {part}" if part in FLOOR_PARTS else part,
                f"E{low}_ms": round(statistics.median(series(timed, part, low, clock)) * 1e3, 1),
                f"E{high}_ms": round(statistics.median(series(timed, part, high, clock)) * 1e3, 1),
                "extra_ms": _ms(d),
                "share_of_step_extra": "" if part == "step" else str(ratio_stats(d, step)),
                "share_of_medians": round(statistics.median(d) / statistics.median(step), 3),
            }
        )
    rest = [s - f - g for s, f, g in zip(step, extra("floor"), extra("gemm"), strict=True)]
    rows.append(
        {
            "clock": clock,
            "part": "rest (step - floor - gemm)",
            "extra_ms": _ms(rest),
            "share_of_step_extra": str(ratio_stats(rest, step)),
            "share_of_medians": round(statistics.median(rest) / statistics.median(step), 3),
        }
    )
    return rows


def adamw_rounds(policy: torch.nn.Module, rounds: int) -> Rounds:
    params = [p.detach().clone().requires_grad_(True) for p in policy.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizers = {
        "loop (foreach=False)": torch.optim.AdamW(params, lr=1e-6, foreach=False),
        "foreach": torch.optim.AdamW(params, lr=1e-6, foreach=True),
        "fused": torch.optim.AdamW(params, lr=1e-6, fused=True),
    }
    return run_rounds({n: o.step for n, o in optimizers.items()}, rounds, warmup=2, order="random")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--experts", type=int, nargs=2, default=[8, 64], metavar=("LOW", "HIGH"))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--adamw-rounds", type=int, default=15)
    add_step_args(parser)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    low, high = args.experts
    steps = {e: Step(e, args.layers, True, args) for e in (low, high)}
    for step in steps.values():  # warm-up: allocator, kernels, optimiser state
        step.run()
    fns = {}
    for e, step in steps.items():
        fns[f"step E{e}"] = step.run
        for part, fn in floor_fns(step.policy, step.cfg.algorithm.minibatches).items():
            fns[f"{part} E{e}"] = fn
        calls = record_grouped_mm(step)
        fns[f"gemm E{e}"] = gemm_fn(calls)
        print(
            f"E{e}: {len(calls)} grouped_mm calls per step, {step.n_params / 1e6:.2f}M parameters"
        )
    timed = run_rounds(fns, args.rounds, warmup=1, order="random")
    rows = decomposition(timed, low, high, "cpu") + decomposition(timed, low, high, "wall")
    print(timed.load_line())
    columns = ["clock", "part", f"E{low}_ms", f"E{high}_ms", "extra_ms", "share_of_step_extra",
               "share_of_medians"]  # fmt: skip
    print_table(rows, columns)

    adamw = adamw_rounds(steps[high].policy, args.adamw_rounds)
    adam_rows = adamw.rows(baseline="fused")
    print(f"\nAdamW step over {steps[high].n_params / 1e6:.2f}M parameters (E{high})")
    print(adamw.load_line())
    print_table(adam_rows, ["variant", "wall_ms", "cpu_ms", "x_wall", "x_cpu"])
    payload = {
        "args": vars(args),
        "params": {e: s.n_params for e, s in steps.items()},
        "decomposition": rows,
        "rounds": timed.record(),
        "adamw": adam_rows,
        "adamw_rounds": adamw.record(baseline="fused"),
    }
    rows_per_step = args.prompts * args.group_size
    write_results(f"expert_cost_L{args.layers}_rows{rows_per_step}", payload)
    return payload


if __name__ == "__main__":
    main()
