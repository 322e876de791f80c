"""Operator calls per RL step of a study's runs, and the GPU step time they imply.

The study models are small (width 128-256): on a GPU their kernels take
microseconds, so an eager step costs about one host-side dispatch per operator
call (Python, the dispatcher, the launch), not FLOPs. This bench counts the aten
operator calls of one whole RL step (weight sync, rollout, measurement forward,
update over all minibatches) of a study variant on the CPU, with a dispatch mode
that sees every call, and turns the count into an ESTIMATE of the GPU step time
at a per-call cost (``--us-per-op``, default 10 us; eager PyTorch measures
about 5-20 us per call on current GPU hosts). It is an estimate until a GPU host
measures the step: docs/results.md labels it so.

The count does not depend on the batch size (decode steps, layers and
minibatches set it), so ``--prompts`` may be small; the rollout decodes to
``rollout.max_new_tokens`` (random weights rarely stop early). On the CPU the
half-precision rollout is emulated (extra rounding calls), so the count is an
upper bound for a native bf16 rollout.

    .venv/bin/python -m bench.bench_step_ops gpu-mismatch moe-bf16 --prompts 2
    .venv/bin/python -m bench.bench_step_ops dose moe-grpo-fp8
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.common import environment, print_table, write_results
from trainer.model import TransformerLM
from trainer.rollout import RolloutEngine
from trainer.rollout.data import RolloutData
from trainer.run.measure_step import measure_batch
from trainer.run.update import PolicyUpdater
from trainer.studies.definition import load_definition

VOCAB = 32
PROMPT_LEN = 12


class OpCounter(TorchDispatchMode):
    """Counts every aten operator call made inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def count_step(study_name: str, variant_name: str, prompts: int) -> dict[str, object]:
    study = load_definition(study_name)
    variant = next((v for v in study.variants if v.name == variant_name), None)
    if variant is None:
        names = ", ".join(v.name for v in study.variants)
        raise SystemExit(f"variant: {variant_name!r} is not in {study_name} ({names})")
    cfg = study.config_for(variant, 0, [f"rollout.prompts_per_step={prompts}"])
    torch.manual_seed(0)
    policy = TransformerLM(cfg.model, VOCAB)
    engine = RolloutEngine(cfg.model, VOCAB, precision=cfg.rollout.precision)
    updater = PolicyUpdater(cfg, policy, None, torch.Generator().manual_seed(1))
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    prompt = torch.randint(3, VOCAB, (rows, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    prompt_mask = torch.ones(rows, PROMPT_LEN, dtype=torch.bool)
    counter = OpCounter()
    phases: dict[str, int] = {}

    def step(count: bool) -> int:
        engine.load_weights(policy.state_dict())
        rollout = engine.generate(
            prompt, prompt_mask, max_new_tokens=cfg.rollout.max_new_tokens,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        if count:
            phases["rollout"] = counter.total
        rewards = torch.arange(rollout.tokens.shape[0], dtype=torch.float32) % 3
        data = RolloutData.from_rollout(rollout, rewards)
        updater.stabilizers.begin_step(0, data)
        measure_batch(cfg, policy, updater, data)
        updater.update(data, 0, lr=1e-4, entropy_coef=0.0)
        return rollout.tokens.shape[1] - PROMPT_LEN

    step(count=False)  # first-call setup is not part of a step
    with counter:
        response_len = step(count=True)
    return {
        "study": study_name,
        "variant": variant_name,
        "layers": cfg.model.n_layers,
        "experts": cfg.model.n_experts,
        "response_tokens": response_len,
        "minibatches": cfg.algorithm.minibatches,
        "steps": cfg.run.steps,
        "op_calls": counter.total,
        "rollout_op_calls": phases["rollout"],
        "top_ops": counter.calls.most_common(6),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("study", nargs="?", default="gpu-mismatch")
    parser.add_argument("variant", nargs="?", default="moe-grpo")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step (count only)")
    parser.add_argument("--us-per-op", type=float, default=10.0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    row = count_step(args.study, args.variant, args.prompts)
    step_s = row["op_calls"] * args.us_per_op * 1e-6
    row["est_gpu_step_s"] = round(step_s, 2)
    row["est_gpu_run_min"] = round(step_s * row["steps"] / 60, 1)
    columns = [k for k in row if k != "top_ops"]
    print_table([row], columns)
    payload = {"args": vars(args), "rows": [row], "environment": environment()}
    write_results(f"step_ops_{args.study}_{args.variant}", payload)
    return payload


if __name__ == "__main__":
    main()
