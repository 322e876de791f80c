"""The device check: one script to run first on a new GPU host (docs/gpu.md).

    .venv/bin/python -m bench.device_check [--out bench/results/device_check] [--budget-s 480]
    .venv/bin/python -m bench.device_check --dry      # on a CPU: the same code paths, tiny

In at most ``--budget-s`` seconds on one GPU it records:

1. ``step_times``: the median of each RL phase (``time/*``, synchronised at the
   phase boundaries on CUDA) for the tiny MoE preset and the GPU presets.
2. ``rollout``: rollout tokens/s of the engine against transformers'
   ``generate()`` on the same Mixtral-shaped model and weights.
3. ``moe_layer``: an MoE layer's forward+backward, reference and fused
   experts, against the dense SwiGLU with the same active parameters, the MFU
   of each (6 x active params x tokens FLOPs over the device's dense peak), and
   the router, grouped GEMMs and experts blocks apart (bench/device_rows/moe_layer.py).
4. ``collectives``: NCCL ``all_reduce`` and ``all_to_all`` bus bandwidth over
   the GPUs present (nccl-tests' bus-bandwidth convention).
5. ``numerics``: CPU-vs-GPU parity of training log-probs (same weights, same
   tokens, fp32 with TF32 off; bf16 beside it for scale).
6. ``same_seed``: the spread of two same-seed short runs, with
   ``run.deterministic`` off and on.
7. ``gpu_tests``: the ``gpu``-marked tests (``tests/trainer/test_gpu.py``).
8. ``decode``: bucketed compiled decode against eager at batch 64 and 1,024, each
   against its memory roofline (bench/device_rows/decode.py).
9. ``packed``: aggregate RL steps per second with 1, 4, 8 and 16 runs packed on
   one GPU, without and with CUDA MPS (bench/device_rows/packed.py).
10. ``trl``: TRL's GRPOTrainer against the lab's RL step on the same 15.5M
   Qwen3-MoE checkpoint (bench/device_rows/trl.py).

It writes ``device_check.json`` and ``device_check.md`` into ``--out``. Without
CUDA (or with ``--dry``) every check runs its code path at a tiny shape on the
CPU, or says why it skipped; those numbers check the script, not a device, and
the summary says so on its face. CI runs the dry mode
(tests/trainer/test_device_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.common import environment, median_device_seconds
from bench.device_rows.decode import decode
from bench.device_rows.moe_layer import moe_layer
from bench.device_rows.packed import packed
from bench.device_rows.trl import trl

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "device_check"
GPU_TESTS = ["tests/trainer/test_gpu.py"]  # every gpu-marked test (tests/test_guards.py)


@dataclass
class Context:
    device: torch.device
    dry: bool
    deadline: float

    def left(self) -> float:
        return self.deadline - time.monotonic()


def _skipped(reason: str) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason}


# --------------------------------------------------------------------------- 1. step times
def _short_run(preset: str, steps: int, ctx: Context, extra: list[str] = ()) -> list[dict]:
    """``steps`` RL steps of ``preset`` from a fresh policy (no warm start: the timing and
    the numerics do not need a base that answers); the metrics rows."""
    from trainer.config import apply_overrides
    from trainer.config.presets import preset_dict
    from trainer.run.runner import train
    from trainer.run_folder.files import read_metrics
    from trainer.validation import validate_config

    overrides = [
        f"run.steps={steps}",
        f"run.eval_every={steps + 1}",
        f"run.checkpoint_every={steps + 1}",
        "warm_start.enabled=false",
        f"run.device={ctx.device.type}",
    ]
    if ctx.dry:  # a tiny batch: the dry mode checks the path, it measures nothing
        overrides += ["run.threads=1", "rollout.prompts_per_step=4", "rollout.group_size=2"]
    cfg = validate_config(apply_overrides(preset_dict(preset), [*overrides, *extra]))
    with tempfile.TemporaryDirectory(prefix="device-check-") as tmp:
        train(cfg, Path(tmp))
        return read_metrics(Path(tmp))


def step_times(ctx: Context) -> dict[str, Any]:
    from trainer import metric_keys as K

    presets = ["moe-grpo"] if ctx.dry else ["moe-grpo", "gpu-dense-grpo", "gpu-moe16-grpo"]
    phases = {"rollout_s": K.TIME_ROLLOUT_S, "measure_s": K.TIME_MISMATCH_S,
              "update_s": K.TIME_TRAIN_S, "step_s": K.TIME_STEP_S}  # fmt: skip
    rows = []
    for preset in presets:
        if ctx.left() < 60:
            rows.append({"preset": preset, **_skipped("time budget spent")})
            continue
        metrics = _short_run(preset, 3 if ctx.dry else 8, ctx)[1:]  # the first step compiles
        rows.append(
            {
                "preset": preset,
                "status": "ran",
                **{
                    name: statistics.median(r[key] for r in metrics) for name, key in phases.items()
                },
                "rollout_tokens_per_s": statistics.median(
                    r[K.THROUGHPUT_TOKENS_PER_S] for r in metrics
                ),
            }
        )
    return {"status": "ran", "rows": rows}


# --------------------------------------------------------------------------- 2. rollout
def _mixtral_pair(ctx: Context, layers: int, d: int, experts: int, hidden: int, vocab: int):
    """The lab's engine and transformers' Mixtral with the same weights (via the lab's
    Hugging Face export and import), or None when transformers is missing."""
    try:
        from transformers import MixtralConfig, MixtralForCausalLM
    except ImportError:
        return None
    from trainer.config import ExperimentConfig
    from trainer.hf import build_model, resolve_model_source
    from trainer.rollout import RolloutEngine

    config = MixtralConfig(
        vocab_size=vocab, hidden_size=d, intermediate_size=hidden, num_hidden_layers=layers,
        num_attention_heads=max(d // 64, 2), num_key_value_heads=max(d // 128, 1),
        num_local_experts=experts, num_experts_per_tok=2, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = MixtralForCausalLM(config).eval()
    with tempfile.TemporaryDirectory(prefix="device-check-hf-") as tmp:
        hf.save_pretrained(tmp)
        cfg = ExperimentConfig.model_validate({"model": {"source": tmp, "max_seq_len": 512}})
        model_cfg = resolve_model_source(cfg).model
        model = build_model(model_cfg, model_cfg.vocab_size)
    precision = "fp32" if ctx.device.type == "cpu" else "bf16"
    engine = RolloutEngine(model_cfg, model_cfg.vocab_size, precision=precision, device=ctx.device)
    engine.load_weights(model.state_dict())
    dtype = torch.float32 if ctx.device.type == "cpu" else torch.bfloat16
    return engine, hf.to(ctx.device, dtype)


def rollout(ctx: Context) -> dict[str, Any]:
    shape = (2, 128, 4, 256, 512) if ctx.dry else (8, 1024, 16, 2048, 32000)
    batch, prompt_len, new_tokens = (4, 8, 8) if ctx.dry else (64, 128, 256)
    pair = _mixtral_pair(ctx, *shape)
    if pair is None:
        return _skipped("transformers is not installed")
    engine, hf = pair
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, shape[-1], (batch, prompt_len), generator=gen).to(ctx.device)
    mask = torch.ones_like(prompt, dtype=torch.bool)

    def ours():
        engine.generate(prompt, mask, new_tokens, temperature=1.0)

    def theirs():
        with torch.no_grad():
            hf.generate(prompt, attention_mask=mask.long(), max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens, do_sample=True, pad_token_id=0)  # fmt: skip

    repeats = 1 if ctx.dry else 3
    times = {name: median_device_seconds(fn, ctx.device, repeats) for name, fn in
             (("engine", ours), ("transformers", theirs))}  # fmt: skip
    tokens = batch * new_tokens
    return {
        "status": "ran",
        "shape": {
            "layers": shape[0],
            "d_model": shape[1],
            "experts": shape[2],
            "expert_hidden": shape[3],
            "batch": batch,
            "prompt": prompt_len,
            "new_tokens": new_tokens,
        },
        "engine_tokens_per_s": tokens / times["engine"],
        "transformers_tokens_per_s": tokens / times["transformers"],
        "speedup": times["transformers"] / times["engine"],
    }


# --------------------------------------------------------------------------- 4. collectives
def _collective_rank(rank: int, world: int, backend: str, port: int, size_mb: int, queue) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    numel = size_mb * 2**20 // 4
    numel -= numel % world
    data = torch.ones(numel, device=device)
    out = torch.empty_like(data)

    # Each collective waits for every rank, so the ranks' timings stay in step.
    seconds = {
        "all_reduce": median_device_seconds(lambda: dist.all_reduce(data), device, repeats=5),
        "all_to_all": median_device_seconds(
            lambda: dist.all_to_all_single(out, data), device, repeats=5
        ),
    }
    if rank == 0:
        queue.put(seconds)
    dist.destroy_process_group()


def collectives(ctx: Context) -> dict[str, Any]:
    import torch.multiprocessing as mp

    if ctx.dry:
        backend, world, size_mb = "gloo", 2, 4
    else:
        world = torch.cuda.device_count()
        if world < 2:
            return _skipped(f"needs 2 or more GPUs ({world} present)")
        backend, size_mb = "nccl", 256
    spawn = mp.get_context("spawn")
    queue = spawn.SimpleQueue()
    port = 29500 + os.getpid() % 1000
    processes = [
        spawn.Process(target=_collective_rank, args=(r, world, backend, port, size_mb, queue))
        for r in range(world)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=max(ctx.left(), 30))
    if any(p.exitcode != 0 for p in processes):
        return {
            "status": "failed",
            "reason": f"a rank exited with {[p.exitcode for p in processes]}",
        }
    seconds = queue.get()
    size = size_mb * 2**20
    # Bus bandwidth as nccl-tests report it: all_reduce moves 2 (n-1)/n of the
    # buffer per rank, all_to_all (n-1)/n.
    factor = {"all_reduce": 2 * (world - 1) / world, "all_to_all": (world - 1) / world}
    return {
        "status": "ran",
        "backend": backend,
        "ranks": world,
        "size_mb": size_mb,
        **{f"{op}_busbw_gbps": factor[op] * size / s / 1e9 for op, s in seconds.items()},
    }


# --------------------------------------------------------------------------- 5. numerics
def numerics(ctx: Context) -> dict[str, Any]:
    if ctx.device.type != "cuda":
        return _skipped("needs CUDA: the check compares a GPU's log-probs with the CPU's")
    from trainer.algorithms.losses import gather_logprobs
    from trainer.config import ModelConfig
    from trainer.model import TransformerLM

    cfg = ModelConfig(n_layers=4, d_model=256, n_heads=4, n_experts=8, top_k=2,
                      expert_hidden=512, max_seq_len=128)  # fmt: skip
    torch.manual_seed(0)
    cpu_model = TransformerLM(cfg, 512).eval()
    tokens = torch.randint(3, 512, (8, 96), generator=torch.Generator().manual_seed(1))
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            reference = gather_logprobs(cpu_model(tokens).logits, tokens)
            gpu_model = TransformerLM(cfg, 512).to(ctx.device).eval()
            gpu_model.load_state_dict(cpu_model.state_dict())
            fp32 = gather_logprobs(gpu_model(tokens.to(ctx.device)).logits, tokens.to(ctx.device))
            gpu_model = gpu_model.to(torch.bfloat16)
            bf16 = gather_logprobs(
                gpu_model(tokens.to(ctx.device)).logits.float(), tokens.to(ctx.device)
            )
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return {
        "status": "ran",
        "fp32_max_abs_diff": float((fp32.cpu() - reference).abs().max()),
        "bf16_max_abs_diff": float((bf16.cpu() - reference).abs().max()),
    }


# --------------------------------------------------------------------------- 6. same seed
def same_seed(ctx: Context) -> dict[str, Any]:
    from trainer import metric_keys as K

    keys = [K.POLICY_LOSS, K.MISMATCH_KL_K3, K.POLICY_GRAD_NORM]
    modes = ["false"] if ctx.dry else ["false", "true"]
    spread = {}
    for mode in modes:
        if ctx.left() < 60:
            spread[f"deterministic={mode}"] = None
            continue
        runs = [_short_run("moe-grpo", 3, ctx, [f"run.deterministic={mode}"]) for _ in range(2)]
        spread[f"deterministic={mode}"] = max(
            abs(a[k] - b[k]) for a, b in zip(*runs, strict=True) for k in keys if k in a
        )
    return {"status": "ran", "max_abs_metric_diff": spread, "metrics": keys}


# --------------------------------------------------------------------------- 7. gpu tests
def gpu_tests(ctx: Context) -> dict[str, Any]:
    if ctx.device.type != "cuda":
        return _skipped("needs CUDA: the gpu-marked tests skip themselves on a CPU")
    # --noconftest: the GPU tests need only the trainer's dependencies, not the
    # platform's (tests/conftest.py configures Django).
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *GPU_TESTS, "-m", "gpu", "--noconftest", "-q",
         "-p", "no:cacheprovider", "-rf"],
        cwd=ROOT, capture_output=True, text=True, timeout=max(ctx.left(), 60),
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return {
        "status": "ran" if done.returncode == 0 else "failed",
        "summary": (lines[-1:] or [""])[0],
        "failed": [line[:400] for line in failed],
    }


CHECKS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "step_times": step_times,
    "rollout": rollout,
    "moe_layer": moe_layer,
    "collectives": collectives,
    "numerics": numerics,
    "same_seed": same_seed,
    "gpu_tests": gpu_tests,
    "decode": decode,
    "packed": packed,
    "trl": trl,
}


def run_checks(ctx: Context, only: list[str] | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, check in CHECKS.items():
        if only and name not in only:
            continue
        start = time.monotonic()
        if ctx.left() <= 0:
            results[name] = _skipped("time budget spent")
            continue
        try:
            results[name] = check(ctx)
        except Exception as exc:  # one broken check must not hide the others' numbers
            results[name] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        results[name]["seconds"] = round(time.monotonic() - start, 2)
    return results


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Device check: {report['device']}", ""]
    if report["dry"]:
        lines += [
            "**Dry run (no GPU):** every check ran its code path at a tiny shape on the CPU "
            "or skipped; these numbers check the script, not a device.",
            "",
        ]
    lines += ["| check | status | seconds | result |", "|---|---|---|---|"]
    for name, result in report["checks"].items():
        shown = {k: v for k, v in result.items() if k not in ("status", "seconds")}
        text = json.dumps(shown, default=str)
        lines.append(f"| {name} | {result['status']} | {result.get('seconds', '')} | `{text}` |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--dry", action="store_true", help="CPU, tiny shapes (also without CUDA)")
    parser.add_argument("--only", nargs="*", choices=sorted(CHECKS), help="run only these checks")
    args = parser.parse_args(argv)
    dry = args.dry or not torch.cuda.is_available()
    device = torch.device("cpu") if dry else torch.device("cuda", 0)
    ctx = Context(device=device, dry=dry, deadline=time.monotonic() + args.budget_s)
    report = {
        "device": "cpu (dry)" if dry else torch.cuda.get_device_name(device),
        "dry": dry,
        "environment": environment(),
        "checks": run_checks(ctx, args.only),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device_check.json").write_text(json.dumps(report, indent=2, default=str))
    (args.out / "device_check.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
