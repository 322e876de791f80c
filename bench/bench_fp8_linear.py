"""FP8 (e4m3) projection GEMM on the CPU: the emulated path (e4m3-rounded
operands, fp32 ``F.linear``, bf16 rounding of the output) against the native
one (``torch._scaled_mm`` on e4m3 operands, bf16 out), through the engine's
own ``Numerics.linear``, plus a whole fp8 ``score`` of the tiny MoE.

Both quantize the activation the same way (per-tensor dynamic scale); the
weights are quantized once at load and not timed. The CPU is not where fp8
rollouts run (the engine picks native only on CUDA sm89+ by itself): this
measures what forcing the native path costs or saves in CPU tests and benches,
and checks on the way that both give the same bits here.

    python -m bench.bench_fp8_linear [--threads 1] [--rounds 15]
"""

from __future__ import annotations

import argparse

import torch

from bench.common import print_table, run_rounds, set_threads, write_results
from trainer.config import ModelConfig
from trainer.model import TransformerLM
from trainer.rollout import RolloutEngine
from trainer.rollout.numerics import Numerics

# (rows M, in K, out N): a decode batch and a prefill through the bench_rollout
# model's widths, and one wider projection.
SHAPES = ((64, 128, 384), (1024, 128, 384), (64, 1024, 1024), (1024, 1024, 1024))
VOCAB = 32
TINY = ModelConfig(
    n_layers=2, d_model=128, n_heads=4, n_experts=8, top_k=2, expert_hidden=256, max_seq_len=64
)


def linear_rows(rounds: int) -> list[dict[str, object]]:
    rows = []
    for m, k, n in SHAPES:
        gen = torch.Generator().manual_seed(0)
        x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen) / k**0.5
        fns, outs = {}, {}
        for mode in ("emulated", "native"):
            num = Numerics("fp8", fp8_gemm=mode)
            weight = num.gemm_weight(w)
            outs[mode] = num.linear(x, weight)
            fns[mode] = lambda num=num, weight=weight, x=x: num.linear(x, weight)
        result = run_rounds(fns, rounds=rounds)
        for row in result.rows(baseline="emulated"):
            row["shape (M, K, N)"] = f"{m} x {k} x {n}"
            row["same bits"] = torch.equal(outs["emulated"], outs["native"])
            rows.append(row)
        print(result.load_line())
    return rows


def score_rows(rounds: int) -> list[dict[str, object]]:
    torch.manual_seed(0)
    model = TransformerLM(TINY, VOCAB)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, VOCAB, (64, 32), generator=gen)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    fns, outs = {}, {}
    for mode in ("emulated", "native"):
        engine = RolloutEngine(TINY, VOCAB, precision="fp8", fp8_gemm=mode)
        engine.load_weights(model.state_dict())
        outs[mode] = engine.score(tokens, mask)[0]
        fns[mode] = lambda engine=engine: engine.score(tokens, mask)
    result = run_rounds(fns, rounds=rounds)
    print(result.load_line())
    rows = result.rows(baseline="emulated")
    for row, mode in zip(rows, ("emulated", "native"), strict=True):
        row["shape (M, K, N)"] = "score 64 x 32 tokens, tiny MoE"
        row["same bits"] = torch.equal(outs["emulated"], outs["native"])
        row["variant"] = f"{mode} ({fns[mode].__defaults__[0].fp8_mode})"
    return rows


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    rows = linear_rows(args.rounds) + score_rows(max(3, args.rounds // 3))
    columns = ["shape (M, K, N)", "variant", "wall_ms", "cpu_ms", "x_cpu", "x_wall", "same bits"]
    print_table(rows, columns)
    path = write_results("fp8_linear", {"rows": rows, "threads": args.threads})
    print(f"\nwrote {path}")
    return {"rows": rows}


if __name__ == "__main__":
    main()
