"""One RL step of the lab against TRL's GRPOTrainer on the same Qwen3-MoE checkpoint.

The checkpoint: a random Qwen3-MoE of 15.5M parameters (4 layers, width 256,
4 heads of 64 with 2 key-value heads, 16 experts top-2 of width 256, vocabulary
4,096, untied head), written once with transformers and a character tokenizer
(``trainer.hf.builtin_tokenizer``). Both trainers load that folder: the lab by
``model.source``, TRL by its path.

One lab RL step against one TRL generation cycle, the same work:

* 16 prompts of the lab's arithmetic task x 8 samples, 16 new tokens each (a
  random policy rarely stops early, so both decode the full length), temperature 1;
* the old log-probs of the 128 completions (the lab's measurement forward; TRL's
  forward at generation time, ``steps_per_generation`` > 1) and a frozen
  reference's (KL coefficient 0.04 in both);
* 4 optimiser steps of 32 completions each (the lab's ``algorithm.minibatches=4``;
  TRL's ``steps_per_generation=4``, ``per_device_train_batch_size=32``), AdamW.

No warm start (both start from the checkpoint). Rollouts in fp32 on the CPU
(TRL generates with the training model, fp32): like with like. The lab's
step's CPU time comes from ``bench.step_clock`` (rollout, measurement, update);
TRL's from a callback that reads the thread's CPU clock at every optimiser
step's begin and end (generation happens inside the first step of a cycle).
Rounds are paired and rotated (bench/common.py): each round runs a short run
of each, drops the first step or cycle (allocator, first calls), and takes the
median of the rest; the speedup is the median over rounds of TRL's over the
lab's, with its interval. On CUDA (``--device cuda``: the device check's ``trl``
row) both train bf16 (TRL ``bf16=True``, the lab ``optim.param_dtype=bf16`` and
bf16 rollouts) and the clock is device-synchronised wall time.

    .venv/bin/python -m bench.bench_trl_step [--rounds 5] [--steps 4] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import machine_load, ratio_stats, round_orders, set_threads, write_results

SHAPE = dict(
    vocab_size=4096, hidden_size=256, intermediate_size=1024, moe_intermediate_size=256,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    num_experts=16, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=256,
    tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[],
)  # fmt: skip
PROMPTS, GROUP, NEW_TOKENS, MINIBATCHES, KL = 16, 8, 16, 4, 0.04
LR = 1e-5
# The device check's dry mode: the same code on a tiny checkpoint and batch.
TINY_SHAPE = {**SHAPE, "vocab_size": 256, "hidden_size": 64, "moe_intermediate_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "head_dim": 16,
              "num_experts": 4}  # fmt: skip
TINY_BATCH = {"prompts": 4, "group": 4, "new_tokens": 4}
BATCH = {"prompts": PROMPTS, "group": GROUP, "new_tokens": NEW_TOKENS}


def write_checkpoint(folder: Path, shape: dict | None = None) -> int:
    """The random 15.5M Qwen3-MoE (or ``shape``) and its tokenizer in ``folder``;
    returns its parameters."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from trainer.hf.builtin_tokenizer import write_builtin_tokenizer

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**(shape or SHAPE))).eval()
    model.save_pretrained(folder)
    write_builtin_tokenizer("char", folder)
    return sum(p.numel() for p in model.parameters())


def lab_config(
    checkpoint: Path, steps: int, device: str, batch: dict = BATCH, extra: list[str] = ()
):
    from trainer.config import apply_overrides
    from trainer.config.presets import preset_dict
    from trainer.validation import validate_config

    bf16 = device == "cuda"
    overrides = [
        f'model.source="{checkpoint}"', f"run.steps={steps}", f"run.eval_every={steps + 1}",
        f"run.checkpoint_every={steps + 1}", "warm_start.enabled=false", f"run.device={device}",
        f"rollout.prompts_per_step={batch['prompts']}", f"rollout.group_size={batch['group']}",
        f"rollout.max_new_tokens={batch['new_tokens']}", f"algorithm.minibatches={MINIBATCHES}",
        f"algorithm.kl_coef={KL}", f"optim.lr={LR}", f"optim.lr_min={LR}", "run.threads=1",
        "task.eval_size=8",
        f'rollout.precision="{"bf16" if bf16 else "fp32"}"',
        f'optim.param_dtype="{"bf16" if bf16 else "fp32"}"',
    ]  # fmt: skip
    return validate_config(apply_overrides(preset_dict("moe-grpo"), [*overrides, *extra]))


def lab_steps(
    checkpoint: Path, steps: int, device: str, batch: dict = BATCH, extra: list[str] = ()
) -> list[float]:
    """Seconds of each lab RL step (thread CPU on the CPU, synchronised wall on CUDA)."""
    from bench.step_clock import StepClock
    from trainer import metric_keys as K
    from trainer.run.runner import train
    from trainer.run_folder.files import read_metrics

    with tempfile.TemporaryDirectory(prefix="trl-bench-lab-") as tmp, StepClock() as clock:
        cfg = lab_config(checkpoint, steps, device, batch, extra)
        train(cfg, Path(tmp), log=lambda *_: None)
        walls = [r[K.TIME_STEP_S] for r in read_metrics(Path(tmp))]
    return walls if device == "cuda" else [s["cpu_s"] for s in clock.steps]


def trl_cycles(checkpoint: Path, cycles: int, device: str, batch: dict = BATCH) -> list[float]:
    """Seconds of each TRL generation cycle (generation + MINIBATCHES optimiser steps)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trainer.tasks import make_task
    from trainer.validation import validate_config

    task = make_task(validate_config({}).task)
    problems = task.sample(batch["prompts"] * cycles, random.Random(0))
    dataset = Dataset.from_dict({
        "prompt": [task.tokenizer.decode(task.tokenizer.encode(p.prompt)) for p in problems],
        "answer": [p.answer for p in problems],
    })  # fmt: skip

    def reward(completions, answer, **kwargs):
        return [float(a in c) for c, a in zip(completions, answer, strict=True)]

    cuda = device == "cuda"
    clock = time.perf_counter if cuda else time.thread_time

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.start = clock()

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.seconds.append(clock() - self.start)

    with tempfile.TemporaryDirectory(prefix="trl-bench-") as tmp:
        args = GRPOConfig(
            output_dir=tmp, max_steps=cycles * MINIBATCHES, per_device_train_batch_size=
            batch["prompts"] * batch["group"] // MINIBATCHES, steps_per_generation=MINIBATCHES,
            num_generations=batch["group"], max_completion_length=batch["new_tokens"], beta=KL,
            learning_rate=LR, temperature=1.0, num_iterations=1, logging_steps=10**6,
            save_strategy="no", report_to="none", use_cpu=not cuda, bf16=cuda, seed=0,
            dataloader_num_workers=0, disable_tqdm=True, shuffle_dataset=False,
        )  # fmt: skip
        trainer = GRPOTrainer(model=str(checkpoint), reward_funcs=reward, args=args,
                              train_dataset=dataset)  # fmt: skip
        times = StepTimes()
        trainer.add_callback(times)
        trainer.train()
    s = times.seconds
    return [sum(s[i : i + MINIBATCHES]) for i in range(0, len(s) - MINIBATCHES + 1, MINIBATCHES)]


def compare(
    checkpoint: Path, rounds: int, steps: int, device: str = "cpu", batch: dict = BATCH,
    extra: list[str] = (),
) -> dict[str, Any]:  # fmt: skip
    """Paired rounds of the lab and TRL on ``checkpoint``; the per-round medians and the
    speedup (TRL's seconds over the lab's)."""
    per = {"lab": [], "trl": []}
    load = [machine_load()]
    for order in round_orders(["lab", "trl"], rounds):
        for name in order:
            runs = (lab_steps(checkpoint, steps, device, batch, extra) if name == "lab"
                    else trl_cycles(checkpoint, steps, device, batch))  # fmt: skip
            per[name].append(statistics.median(runs[1:] or runs))  # the first one warms up
        load.append(machine_load())
    speedup = ratio_stats(per["trl"], per["lab"])
    return {
        "device": device,
        "clock": "synchronised wall" if device == "cuda" else "thread CPU (1 torch thread)",
        "rounds": rounds,
        "steps_per_run": steps,
        "lab_overrides": list(extra),
        "lab_step_s": per["lab"],
        "trl_cycle_s": per["trl"],
        "lab_median_s": statistics.median(per["lab"]),
        "trl_median_s": statistics.median(per["trl"]),
        "speedup": speedup.as_dict(),
        "load": [x["loadavg_1m"] for x in load],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="lab steps (TRL cycles) per run")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--quick", action="store_true", help="1 round of 2 steps")
    parser.add_argument(
        "--lab-set", action="append", default=[],
        help='a lab config override, e.g. optim.logprobs=\\"full\\" (the step before it)',
    )  # fmt: skip
    args = parser.parse_args(argv)
    set_threads(1)
    rounds, steps = (1, 2) if args.quick else (args.rounds, args.steps)
    with tempfile.TemporaryDirectory(prefix="trl-bench-ckpt-") as tmp:
        params = write_checkpoint(Path(tmp))
        result = {
            "parameters": params,
            **compare(Path(tmp), rounds, steps, args.device, BATCH, args.lab_set),
        }
    print(
        f"{params / 1e6:.1f}M Qwen3-MoE, {args.device}: lab step {result['lab_median_s']:.3f} s, "
        f"TRL cycle {result['trl_median_s']:.3f} s, lab {result['speedup']['median']:.2f}x "
        f"[{result['speedup']['low']:.2f}, {result['speedup']['high']:.2f}] ({rounds} rounds)"
    )
    write_results("trl_step_with_overrides" if args.lab_set else "trl_step", result)
    return result


if __name__ == "__main__":
    main()
