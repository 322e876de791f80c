"""MoE layer speed against a dense FFN with the same ACTIVE parameters and
against transformers' MixtralSparseMoeBlock.

Two shapes:
* training: hidden 256, expert width 512, 16 experts, top-2, 4096 tokens,
  forward + backward. Target: <= 1.10x the dense-active FFN (width 1024) and
  no slower than transformers' fastest path.
* decode: 64 tokens, 8 experts, top-2, forward only. Every expert's weights
  are read for ~16 rows, so weight reading bounds the layer at E/k = 4x the
  dense-active time (the "floor"). Target: within 10% of the floor.

Medians after warm-up, interleaved, 2 threads by default.

    python -m bench.bench_moe_layer [--threads 2] [--repeats 15]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

from bench.common import print_table, time_interleaved, write_results
from trainer.model.layers import SwiGLU
from trainer.model.moe import MoELayer


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
    out: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "dense-active SwiGLU": make_dense(d, k * h)
    }
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
        return max(
            (fn(x) - ref).abs().max().item()
            for name, fn in fns.items()
            if name != "dense-active SwiGLU"
        )


def bench_training(repeats: int) -> list[dict[str, object]]:
    d, e, k, h, n = 256, 16, 2, 512, 4096
    fns = variants(d, e, k, h)
    x = torch.randn(1, n, d, requires_grad=True)
    grad = torch.randn(1, n, d)
    max_dev = check_same_output(fns, x)
    times = time_interleaved({name: fwd_bwd(fn, x, grad) for name, fn in fns.items()}, 3, repeats)
    dense = times["dense-active SwiGLU"]
    rows = [
        {
            "shape": "train fwd+bwd",
            "variant": name,
            "ms": t * 1e3,
            "x dense": t / dense,
            "target": "<= 1.10x" if name == "ours grouped_mm" else "",
        }
        for name, t in times.items()
    ]
    rows[0]["note"] = f"max |ours - transformers| = {max_dev:.1e}"
    return rows


def bench_decode(repeats: int) -> list[dict[str, object]]:
    d, e, k, h, n = 256, 8, 2, 512, 64
    fns = variants(d, e, k, h)
    x = torch.randn(1, n, d)
    times = time_interleaved({name: fwd_only(fn, x) for name, fn in fns.items()}, 10, repeats * 4)
    dense = times["dense-active SwiGLU"]
    floor = e / k
    return [
        {
            "shape": "decode fwd (64 tok)",
            "variant": name,
            "ms": t * 1e3,
            "x dense": t / dense,
            "target": f"floor {floor:.1f}x, <= {1.1 * floor:.1f}x"
            if name.startswith("ours")
            else "",
        }
        for name, t in times.items()
    ]


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    rows = bench_training(args.repeats) + bench_decode(args.repeats)
    print_table(rows, ["shape", "variant", "ms", "x dense", "target", "note"])
    train = {r["variant"]: r for r in rows if r["shape"].startswith("train")}
    decode = {r["variant"]: r for r in rows if r["shape"].startswith("decode")}
    hf_train = [r["ms"] for name, r in train.items() if name.startswith("transformers")]
    summary = {
        "train_ratio_vs_dense": train["ours grouped_mm"]["x dense"],
        "train_target_met": train["ours grouped_mm"]["x dense"] <= 1.10
        and (not hf_train or train["ours grouped_mm"]["ms"] <= min(hf_train)),
        "decode_ratio_vs_dense": decode["ours grouped_mm"]["x dense"],
        "decode_floor": 8 / 2,
        "decode_target_met": decode["ours grouped_mm"]["x dense"] <= 1.1 * 8 / 2,
        "faster_backend_train": min(("ours grouped_mm", "ours loop"), key=lambda n: train[n]["ms"]),
        "faster_backend_decode": min(
            ("ours grouped_mm", "ours loop"), key=lambda n: decode[n]["ms"]
        ),
    }
    print()
    for key, value in summary.items():
        print(f"{key}: {value}")
    path = write_results("moe_layer", {"rows": rows, "summary": summary})
    print(f"\nwrote {path}")
    return summary


if __name__ == "__main__":
    main()
