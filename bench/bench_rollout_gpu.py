"""Whole rollouts on a GPU: eager against compiled decode, bf16 against fp8 and fp32.

One ``RolloutEngine.generate`` of a fixed length (no stop token, so every
variant decodes the same number of steps) on a ``gpu-*`` preset's model, at a
small batch (where launch overhead rules, and a captured decode step should
help) and at the preset's rollout batch. Variants:

* ``bf16 eager``: what GPU presets run today;
* ``bf16 compiled``: ``rollout.decode=compiled``, the decode step over
  power-of-two buckets of the KV cache, one graph per bucket, captured as a
  CUDA graph (``torch.compile(mode="reduce-overhead")``);
* ``fp8 eager``: ``rollout.precision=fp8`` with the capability's native
  e4m3 GEMMs (``torch._scaled_mm`` / ``_scaled_grouped_mm`` on sm90);
* ``fp32 eager`` and ``fp32 compiled``: the zero-gap control's engine.

Times are CUDA-synchronised medians of ``--repeats`` calls after two warm-up
calls; a compiled variant's first call (compile and capture) is reported apart.
Each row states the step against its memory roofline (bench/roofline.py: the
weights and KV-cache bytes a step reads over the device's HBM bandwidth).

    python -m bench.bench_rollout_gpu [--preset gpu-moe16-grpo] [--dry]

``--dry`` (or no CUDA): the tiny preset on the CPU at a tiny batch, eager
variants only; it checks the script, not a device.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from bench.common import environment, median_device_seconds
from bench.roofline import decode_step_bytes, roofline_s
from trainer.config.presets import resolve_preset
from trainer.devices.capability import device_capability
from trainer.model import TransformerLM
from trainer.model.dispatch import choose_backend
from trainer.rollout.engine import RolloutEngine
from trainer.rollout.static_decode import bucket_for, decode_buckets

VARIANTS = [("bf16", "eager"), ("bf16", "compiled"), ("fp8", "eager"),
            ("fp32", "eager"), ("fp32", "compiled")]  # fmt: skip
VOCAB = 512  # larger than the arithmetic task's, so the LM head is not a negligible GEMM


def measure(preset: str, batch: int, prompt: int, new: int, precision: str, decode: str,
            device: torch.device, repeats: int) -> dict:  # fmt: skip
    cfg = resolve_preset(preset).model
    torch.manual_seed(0)
    policy = TransformerLM(cfg, VOCAB)
    engine = RolloutEngine(cfg, VOCAB, precision=precision, device=device, decode=decode)
    engine.load_weights(policy.state_dict())
    del policy
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, VOCAB, (batch, prompt), generator=gen).to(device)
    mask = torch.ones_like(tokens, dtype=torch.bool)

    def rollout():
        engine.generate(tokens, mask, max_new_tokens=new, temperature=1.0, eos_id=None)

    skips_before = counters["inductor"]["cudagraph_skips"]
    # the first call apart (compile and capture, for a compiled step), one more warm-up
    first = median_device_seconds(rollout, device, repeats=1, warmups=0)
    seconds = median_device_seconds(rollout, device, repeats, warmups=1)
    columns = _mean_columns(prompt, new, decode)
    step_bytes = decode_step_bytes(cfg, VOCAB, batch, columns, engine.num.dtype.itemsize)
    floor = roofline_s(step_bytes["total"], _device_name(device))
    per_step = seconds / new
    return {
        "preset": preset,
        "batch": batch,
        "precision": precision,
        "decode": decode,
        "fp8": engine.fp8_mode,
        "moe_backend": choose_backend(
            engine.moe_backend, device.type, engine.num.dtype, device_capability(device)
        ),
        # compiled: whether inductor captured the step as a CUDA graph
        "cuda_graph": None
        if decode != "compiled" or device.type != "cuda"
        else counters["inductor"]["cudagraph_skips"] == skips_before,
        "first_call_s": round(first, 3),
        "rollout_s": round(seconds, 4),
        "tokens_per_s": round(batch * new / seconds),
        "ms_per_decode_step": round(1000 * per_step, 3),
        # the memory roofline (bench/roofline.py): weights + KV cache read per step
        "columns_attended": round(columns, 1),
        "step_mb": {k: round(v / 1e6, 2) for k, v in step_bytes.items()},
        "roofline_ms": None if floor is None else round(1000 * floor, 4),
        "x_roofline": None if floor is None else round(per_step / floor, 1),
    }


def _mean_columns(prompt: int, new: int, decode: str) -> float:
    """Mean cache columns a decode step attends over: eager reads up to its column;
    the compiled step reads its bucket (trainer.rollout.static_decode)."""
    total = prompt + new
    cols = [prompt + s + 1 for s in range(new - 1)]
    if decode == "compiled":
        buckets = decode_buckets(total)
        cols = [bucket_for(c, buckets) for c in cols]
    return sum(cols) / len(cols)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="gpu-moe16-grpo")
    parser.add_argument("--batches", type=int, nargs="*", default=[64, 1024])
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/results/rollout_gpu.json"))
    args = parser.parse_args(argv)
    dry = args.dry or not torch.cuda.is_available()
    device = torch.device("cpu") if dry else torch.device("cuda", 0)
    preset, batches, new = ("moe-grpo", [4], 8) if dry else (args.preset, args.batches, args.new)
    variants = [v for v in VARIANTS if v[1] == "eager"] if dry else VARIANTS
    rows = []
    for batch in batches:
        for precision, decode in variants:
            try:
                row = measure(preset, batch, args.prompt if not dry else 8, new, precision,
                              decode, device, 1 if dry else args.repeats)  # fmt: skip
            except Exception as exc:  # one variant that cannot run must not hide the others
                row = {"preset": preset, "batch": batch, "precision": precision,
                       "decode": decode, "error": f"{type(exc).__name__}: {exc}"[:300]}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
            _write(args.out, dry, new, rows)  # a run stopped by a time limit keeps its rows
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return _write(args.out, dry, new, rows)


def _write(out: Path, dry: bool, new: int, rows: list[dict]) -> dict:
    report = {"dry": dry, "environment": environment(), "new_tokens": new, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
