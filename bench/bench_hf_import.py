"""Importing a Hugging Face checkpoint: time and peak memory, and the RL step
of an imported model against the same shape built natively.

1. Import: a ~100M-parameter Qwen3-MoE checkpoint is made offline with
   transformers (random weights, fp32 safetensors) and imported in a fresh
   process (``resolve_model_source`` + ``build_model``). Reported: wall time
   and the peak resident memory the import added (VmHWM after minus the RSS
   before, with torch and the trainer already imported), as a
   multiple of the checkpoint's size on disk. Target: < 1.3x.
2. RL step: the tiny Qwen3-MoE of the parity tests (3 blocks, one dense; GQA,
   q/k norm, 8 experts top-2) imported, against a builtin model with the
   same ModelConfig shape fields, in ``--repeats`` paired rounds (every variant
   once per round, rotated order); per run the median step in wall time (the
   trainer's ``time/step_s``) and CPU time (bench.step_clock), the ratios the
   median over rounds of the per-round ratio with their 95% interval (trust the
   CPU-time one on a loaded machine). They run the same code, so the ratio
   should be ~1.
   Also the imported model with ``optim.param_dtype=bf16`` (bf16 weights,
   fp32 masters): on a CPU, bf16 matmuls are slower than fp32 ones, so this
   row measures the cost of the switch there, not its GPU benefit.

    .venv/bin/python -m bench.bench_hf_import [--threads 1] [--steps 8] [--only rl-step]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.common import Rounds, Stopwatch, Timing, round_orders, write_results
from bench.step_clock import StepClock

TESTS = Path(__file__).resolve().parent.parent / "tests"

# ~100M parameters: 6 blocks of 16 experts (3 x 512 x 512 each), GQA attention,
# a 16k vocabulary with an untied head.
BIG = {
    "vocab_size": 16000,
    "hidden_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 512,
    "intermediate_size": 1536,
    "tie_word_embeddings": False,
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    """This process image's high-water RSS (VmHWM). Not ``ru_maxrss``: Linux
    carries that over from the parent across fork + exec, so the parent's
    memory (here the transformers model that wrote the checkpoint) would count."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child_import(folder: str) -> None:
    """Run in a fresh process: import the checkpoint, print time and memory as JSON."""
    from trainer.config import ExperimentConfig
    from trainer.hf import build_model, resolve_model_source

    before = _rss_bytes()
    watch = Stopwatch("process")
    cfg = resolve_model_source(ExperimentConfig.model_validate({"model": {"source": folder}}))
    model = build_model(cfg.model, cfg.model.vocab_size)
    spent = watch.elapsed()
    peak = _peak_rss_bytes()
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"seconds": spent.wall, "cpu_seconds": spent.cpu, "rss_before": before,
                      "peak": peak, "params": n_params}))  # fmt: skip


def bench_import(threads: int, shard_mb: int = 0, vocab: int = BIG["vocab_size"]) -> dict:
    sys.path.insert(0, str(TESTS))
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        shards = {"max_shard_size": f"{shard_mb}MB"} if shard_mb else {"max_shard_size": "100GB"}
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**BIG, "vocab_size": vocab}))
        model.save_pretrained(tmp, **shards)
        del model  # freed before the imports
        size = sum(f.stat().st_size for f in Path(tmp).glob("*.safetensors"))
        n_shards = len(list(Path(tmp).glob("*.safetensors")))
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        runs = []
        for _ in range(3):
            out = subprocess.run(
                [sys.executable, "-m", "bench.bench_hf_import", "--child-import", tmp],
                capture_output=True, text=True, check=True, env=env,
                cwd=Path(__file__).resolve().parent.parent,
            )  # fmt: skip
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["seconds"])
    added = statistics.median(r["peak"] - r["rss_before"] for r in runs)
    return {
        "params": best["params"],
        "checkpoint_mb": size / 1e6,
        "shards": n_shards,
        "import_s_median": statistics.median(r["seconds"] for r in runs),
        "import_cpu_s_median": statistics.median(r["cpu_seconds"] for r in runs),
        "peak_added_mb": added / 1e6,
        "peak_over_checkpoint": added / size,
    }


def bench_rl_step(threads: int, steps: int, warmup: int, repeats: int = 3) -> dict:
    scope = "thread" if threads == 1 else "process"
    sys.path.insert(0, str(TESTS))
    from hf_tiny_checkpoints import save_char_tokenizer, save_hf_checkpoint

    from trainer import metric_keys as K
    from trainer.config import ExperimentConfig
    from trainer.hf import resolve_model_source
    from trainer.hf.families import SHAPE_FIELDS
    from trainer.run.runner import train
    from trainer.run_folder.files import read_metrics
    from trainer.tasks.tokenizer import CharTokenizer

    base = {
        "warm_start": {"enabled": False},
        "rollout": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 8},
        "algorithm": {"minibatches": 4},
        "run": {
            "steps": steps,
            "eval_every": steps + 1,
            "checkpoint_every": steps + 1,
            "threads": threads,
        },
    }
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        # The vocabulary of the lab's character tokenizer, so that the native
        # model (which uses that tokenizer) has the same embedding and head.
        save_hf_checkpoint("qwen3_moe", src, vocab_size=CharTokenizer().vocab_size)
        save_char_tokenizer(src)
        imported = resolve_model_source(
            ExperimentConfig.model_validate(
                {**base, "model": {"source": str(src), "max_seq_len": 64}}
            )
        )
        shape = {name: getattr(imported.model, name) for name in SHAPE_FIELDS}
        shape["family"] = "builtin"
        native = ExperimentConfig.model_validate({**base, "model": {**shape, "max_seq_len": 64}})
        bf16 = imported.model_copy(
            update={"optim": imported.optim.model_copy(update={"param_dtype": "bf16"})}
        )
        os.environ["MOE_LAB_CACHE"] = str(Path(tmp) / "cache")
        configs = {"imported": imported, "native": native, "imported_bf16": bf16}
        # Paired rounds (every variant once per round, rotated order), each run's
        # median step in wall and CPU time (bench.step_clock).
        timed = Rounds(list(configs), scope=scope)
        for repeat, order in enumerate(round_orders(list(configs), repeats, "rotate")):
            timed.begin_round(order)
            for name in order:
                run_dir = Path(tmp) / f"{name}-{repeat}"
                with StepClock(scope) as clock:
                    train(configs[name], run_dir, log=lambda _msg: None)
                wall = statistics.median(r[K.TIME_STEP_S] for r in read_metrics(run_dir)[warmup:])
                cpu = statistics.median(r["cpu_s"] for r in clock.steps[warmup:])
                timed.add(name, Timing(wall, cpu))
        timed.finish()
    print(f"  {timed.load_line()}")
    for name in configs:
        for clock in ("wall", "cpu"):
            out[f"{name}_step_{clock}_s"] = timed.median(name, clock)
    for clock in ("wall", "cpu"):
        out[f"imported_over_native_{clock}"] = timed.ratio("imported", "native", clock).as_dict()
        out[f"bf16_over_fp32_{clock}"] = timed.ratio("imported_bf16", "imported", clock).as_dict()
    out["rounds"] = timed.record()
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="paired RL-step rounds")
    parser.add_argument(
        "--only", choices=["import", "rl-step"], help="run one of the two measurements"
    )
    parser.add_argument("--shard-mb", type=int, default=0, help="import: shard size (0 = one file)")
    parser.add_argument("--vocab", type=int, default=BIG["vocab_size"], help="import: vocabulary")
    parser.add_argument("--child-import", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_import:
        torch.set_num_threads(args.threads)
        child_import(args.child_import)
        return {}
    torch.set_num_threads(args.threads)
    result: dict = {"threads": args.threads}
    print(f"HF import, {args.threads} threads")
    if args.only in (None, "import"):
        result.update(bench_import(args.threads, args.shard_mb, args.vocab))
        print(f"  parameters            {result['params'] / 1e6:8.1f} M")
        print(
            f"  checkpoint            {result['checkpoint_mb']:8.1f} MB in {result['shards']} "
            "file(s) (fp32 safetensors)"
        )
        print(
            f"  import time (median)  {result['import_s_median']:8.2f} s wall, "
            f"{result['import_cpu_s_median']:.2f} s CPU"
        )
        print(
            f"  peak RSS added        {result['peak_added_mb']:8.1f} MB = "
            f"{result['peak_over_checkpoint']:.2f}x the checkpoint (target < 1.3x: "
            f"{'met' if result['peak_over_checkpoint'] < 1.3 else 'NOT met'})"
        )
    if args.only in (None, "rl-step"):
        result.update(bench_rl_step(args.threads, args.steps, args.warmup, args.repeats))
        print(f"  {'':<22} {'wall':>9} {'CPU':>9}")
        for name in ("imported", "native", "imported_bf16"):
            w, c = (result[f"{name}_step_{clock}_s"] * 1000 for clock in ("wall", "cpu"))
            print(f"  RL step {name:<14} {w:7.1f}ms {c:7.1f}ms")
        for key in ("imported_over_native", "bf16_over_fp32"):
            w, c = (result[f"{key}_{clock}"]["median"] for clock in ("wall", "cpu"))
            print(f"  {key:<22} {w:9.2f} {c:9.2f}")
    name = "hf_import" if args.only is None else f"hf_import_{args.only}"
    write_results(name, {"args": vars(args), **result})
    return result


if __name__ == "__main__":
    main()
