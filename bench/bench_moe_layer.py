"""MoE layer speed against a dense FFN with the same ACTIVE parameters and
against transformers' MixtralSparseMoeBlock.

Two shapes:
* training: hidden 256, expert width 512, 16 experts, top-2, 4096 tokens,
  forward + backward. Target: <= 1.10x the dense-active FFN (width 1024) and
  no slower than transformers' fastest path.
* decode: 64 tokens, 8 experts, top-2, forward only. Every expert's weights
  are read for ~16 rows, so weight reading bounds the layer at E/k = 4x the
  dense-active time (the "floor"). Target: within 10% of the floor.

Timed in paired rounds (bench.common.run_rounds: every variant once per round,
rotated order), wall and thread CPU time; "x dense" is the median over rounds
of the per-round ratio to the dense-active FFN, with its order-statistic 95%
interval. On a loaded machine trust the CPU-time ratio. One thread by default.

    python -m bench.bench_moe_layer [--threads 1] [--rounds 15] [--tokens 4096]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

from bench.common import Rounds, print_table, run_rounds, set_threads, write_results
from trainer.model.layers import SwiGLU
from trainer.model.moe import MoELayer

DENSE = "dense-active SwiGLU"


def make_moe(d: int, e: int, k: int, h: int, backend: str, seed: int = 0) -> MoELayer:
    torch.manual_seed(seed)
    layer = MoELayer(d, e, k, h, backend=backend)
    for p in layer.parameters():
        nn.init.normal_(p, std=0.02)
    return layer


def make_hf_block(moe: MoELayer, implementation: str) -> nn.Module | None:
    """transformers' Mixtral block with the same weights; None when not installed."""
    try:
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    except ImportError:
        return None
    e, d, h = moe.experts.w_gate.shape
    config = MixtralConfig(
        hidden_size=d,
        intermediate_size=h,
        num_local_experts=e,
        num_experts_per_tok=moe.top_k,
        experts_implementation=implementation,
    )
    block = MixtralSparseMoeBlock(config)
    with torch.no_grad():
        block.gate.weight.copy_(moe.router.weight)
        gate_up = torch.cat((moe.experts.w_gate, moe.experts.w_up), dim=2)
        block.experts.gate_up_proj.copy_(gate_up.transpose(1, 2))
        block.experts.down_proj.copy_(moe.experts.w_down.transpose(1, 2))
    return block


def make_dense(d: int, hidden: int, seed: int = 0) -> SwiGLU:
    torch.manual_seed(seed)
    ffn = SwiGLU(d, hidden)
    for p in ffn.parameters():
        nn.init.normal_(p, std=0.02)
    return ffn


def moe_call(layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    if isinstance(layer, MoELayer):
        return lambda x: layer(x)[0]
    return layer


def fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor):
    def run():
        x.grad = None
        fn(x).backward(grad)

    return run


def fwd_only(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor):
    def run():
        with torch.no_grad():
            fn(x)

    return run


def variants(d: int, e: int, k: int, h: int) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    out: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {DENSE: make_dense(d, k * h)}
    reference = make_moe(d, e, k, h, "grouped_mm")
    out["ours grouped_mm"] = moe_call(reference)
    out["ours loop"] = moe_call(make_moe(d, e, k, h, "loop"))
    for impl in ("eager", "grouped_mm"):
        block = make_hf_block(reference, impl)
        if block is not None:
            out[f"transformers {impl}"] = block
    return out


def check_same_output(fns: dict[str, Callable], x: torch.Tensor) -> float:
    """Largest deviation of every MoE variant from ours (same weights)."""
    with torch.no_grad():
        ref = fns["ours grouped_mm"](x)
        return max((fn(x) - ref).abs().max().item() for name, fn in fns.items() if name != DENSE)


def timed_rows(shape: str, rounds: Rounds, target: str) -> list[dict[str, object]]:
    rows = rounds.rows(baseline=DENSE)
    for row in rows:
        row["shape"] = shape
        row["target"] = target if row["variant"].startswith("ours") else ""
    return rows


def bench_training(rounds: int, tokens: int) -> tuple[list[dict[str, object]], Rounds]:
    d, e, k, h = 256, 16, 2, 512
    fns = variants(d, e, k, h)
    x = torch.randn(1, tokens, d, requires_grad=True)
    grad = torch.randn(1, tokens, d)
    max_dev = check_same_output(fns, x)
    timed = run_rounds({name: fwd_bwd(fn, x, grad) for name, fn in fns.items()}, rounds, warmup=2)
    rows = timed_rows(f"train fwd+bwd ({tokens} tok)", timed, "<= 1.10x")
    rows[0]["note"] = f"max |ours - transformers| = {max_dev:.1e}"
    return rows, timed


def bench_decode(rounds: int) -> tuple[list[dict[str, object]], Rounds]:
    d, e, k, h, n = 256, 8, 2, 512, 64
    fns = variants(d, e, k, h)
    x = torch.randn(1, n, d)
    timed = run_rounds({name: fwd_only(fn, x) for name, fn in fns.items()}, rounds * 4, warmup=10)
    floor = e / k
    return timed_rows(
        "decode fwd (64 tok)", timed, f"floor {floor:.1f}x, <= {1.1 * floor:.1f}x"
    ), timed


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", "--repeats", type=int, default=15, dest="rounds")
    parser.add_argument("--tokens", type=int, default=4096, help="training shape's tokens")
    parser.add_argument("--only", choices=["train", "decode"], default=None)
    args = parser.parse_args(argv)
    set_threads(args.threads)

    rows: list[dict[str, object]] = []
    record: dict[str, object] = {"args": vars(args)}
    summary: dict[str, object] = {}
    columns = ["shape", "variant", "wall_ms", "cpu_ms", "x_wall", "x_cpu", "target", "note"]
    if args.only in (None, "train"):
        train_rows, train = bench_training(args.rounds, args.tokens)
        rows += train_rows
        record["train"] = train.record(baseline=DENSE)
        ratio = train.ratio("ours grouped_mm", DENSE, "cpu")
        hf = [n for n in train.names if n.startswith("transformers")]
        summary |= {
            "train_ratio_vs_dense_cpu": ratio.as_dict(),
            "train_ratio_vs_dense_wall": train.ratio("ours grouped_mm", DENSE, "wall").as_dict(),
            "train_target_met_cpu": ratio.median <= 1.10
            and all(train.ratio("ours grouped_mm", n, "cpu").median <= 1.0 for n in hf),
            "faster_backend_train_cpu": min(
                ("ours grouped_mm", "ours loop"), key=lambda n: train.median(n, "cpu")
            ),
        }
        print(train.load_line())
    if args.only in (None, "decode"):
        decode_rows, decode = bench_decode(args.rounds)
        rows += decode_rows
        record["decode"] = decode.record(baseline=DENSE)
        ratio = decode.ratio("ours grouped_mm", DENSE, "cpu")
        summary |= {
            "decode_ratio_vs_dense_cpu": ratio.as_dict(),
            "decode_ratio_vs_dense_wall": decode.ratio("ours grouped_mm", DENSE, "wall").as_dict(),
            "decode_floor": 8 / 2,
            "decode_target_met_cpu": ratio.median <= 1.1 * 8 / 2,
            "faster_backend_decode_cpu": min(
                ("ours grouped_mm", "ours loop"), key=lambda n: decode.median(n, "cpu")
            ),
        }
        print(decode.load_line())
    print_table(rows, columns)
    print()
    for key, value in summary.items():
        print(f"{key}: {value}")
    path = write_results("moe_layer", {"rows": rows, "summary": summary, **record})
    print(f"\nwrote {path}")
    return summary


if __name__ == "__main__":
    main()
