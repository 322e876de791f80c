"""RL-step cost at FIXED active parameters as the expert count grows.

Every model routes each token to top-2 experts of the same width, so the
parameters a token uses stay the same while the total grows with the expert
count. One RL step = weight sync into the rollout engine + rollout + the
measurement forward + the update (minibatches), on a fixed prompt batch, without
the warm start. "before" runs the update with the per-parameter (for-loop) AdamW,
"after" with the fused AdamW the trainer now builds. All
configurations are timed interleaved in one process (shared-machine noise hits
each alike); ratios are to the 8-expert model of the same depth.
``total_param_floor_ms`` is the part of a step that follows the total parameter
count at any batch size (AdamW, the clipping norm, every gradient buffer, per
minibatch), measured on its own: the floor under what more experts cost.

    .venv/bin/python -m bench.bench_active_params [--experts 8 16 32 64] [--layers 2 8]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from bench.common import environment, print_table, write_results
from trainer.config import ExperimentConfig
from trainer.rollout import RolloutEngine
from trainer.rollout.data import RolloutData
from trainer.run.measure_step import measure_batch
from trainer.run.update import PolicyUpdater

VOCAB = 32


class Step:
    """One configuration's policy, engine, updater and fixed prompts."""

    def __init__(self, n_experts: int, n_layers: int, foreach: bool, args) -> None:
        self.cfg = ExperimentConfig.model_validate(
            {
                "model": {"n_layers": n_layers, "d_model": args.d_model, "n_heads": 4,
                          "n_experts": n_experts, "top_k": 2, "expert_hidden": args.expert_hidden,
                          "vocab_size": VOCAB},
                "rollout": {"prompts_per_step": args.prompts, "group_size": args.group_size,
                            "max_new_tokens": args.new_tokens, "precision": "fp32"},
                "algorithm": {"name": "grpo", "minibatches": 2, "kl_coef": 0.0},
            }
        )  # fmt: skip
        torch.manual_seed(0)
        from trainer.model import TransformerLM

        self.policy = TransformerLM(self.cfg.model, VOCAB)
        self.engine = RolloutEngine(self.cfg.model, VOCAB, precision="fp32")
        self.updater = PolicyUpdater(self.cfg, self.policy, None, torch.Generator().manual_seed(1))
        if not foreach:  # the previous optimiser: one Python-loop AdamW step per tensor
            old = self.updater.optimizer
            groups = [
                {k: copy.copy(v) for k, v in g.items() if k not in ("params", "foreach", "fused")}
                | {"params": list(g["params"])}
                for g in old.param_groups
            ]
            self.updater.optimizer = torch.optim.AdamW(groups, foreach=False)
        gen = torch.Generator().manual_seed(0)
        b = args.prompts * args.group_size
        self.prompts = torch.randint(3, VOCAB, (b, 8), generator=gen)
        self.prompt_mask = torch.ones(b, 8, dtype=torch.bool)
        self.n_params = sum(p.numel() for p in self.policy.parameters())
        self.parts: dict[str, list[float]] = {"sync": [], "step": [], "optim": []}

    def run(self) -> None:
        t0 = time.perf_counter()
        self.engine.load_weights(self.policy.state_dict())
        t_sync = time.perf_counter()
        rollout = self.engine.generate(
            self.prompts, self.prompt_mask, max_new_tokens=self.cfg.rollout.max_new_tokens,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        rewards = torch.arange(rollout.tokens.shape[0], dtype=torch.float32) % 3
        data = RolloutData.from_rollout(rollout, rewards)
        self.updater.stabilizers.begin_step(0, data)
        measure_batch(self.cfg, self.policy, self.updater, data)
        opt = self.updater.optimizer
        spent = [0.0]
        original = opt.step

        def timed_step(*a, **kw):
            s = time.perf_counter()
            out = original(*a, **kw)
            spent[0] += time.perf_counter() - s
            return out

        opt.step = timed_step
        try:
            self.updater.update(data, 0, lr=1e-4, entropy_coef=0.0)
        finally:
            opt.step = original
        self.parts["sync"].append(t_sync - t0)
        self.parts["step"].append(time.perf_counter() - t0)
        self.parts["optim"].append(spent[0])


def total_parameter_floor_ms(policy: torch.nn.Module, minibatches: int, repeats: int = 10) -> float:
    """Milliseconds per RL step that follow the TOTAL parameter count whatever the
    batch: per minibatch, one fused AdamW step, one global-norm clip and the
    gradient buffers of every parameter (written by the backward even for an
    expert that got no token). A lower bound on what 64 experts add over 8."""
    params = [p for p in policy.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-6, fused=True)

    def new_grads() -> None:
        for p in params:
            p.grad = torch.zeros_like(p)

    parts = {
        "adam": optimizer.step,
        "clip": lambda: torch.nn.utils.clip_grad_norm_(params, 1.0),
        "grads": new_grads,
    }
    total = 0.0
    for fn in parts.values():
        for _ in range(3):
            fn()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        total += statistics.median(samples)
    for p in params:
        p.grad = None
    return total * minibatches * 1e3


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--experts", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--expert-hidden", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    steps = {
        (e, n, v): Step(e, n, v == "after", args)
        for n in args.layers
        for e in args.experts
        for v in ("before", "after")
    }
    for step in steps.values():  # warm-up: allocator, kernels
        step.run()
    for step in steps.values():
        step.parts = {k: [] for k in step.parts}
    for _ in range(args.repeats):
        for step in steps.values():
            step.run()
    med = {key: {k: statistics.median(v) for k, v in s.parts.items()} for key, s in steps.items()}
    rows = []
    for n in args.layers:
        for e in args.experts:
            row = {
                "layers": n,
                "experts": e,
                "params_M": round(steps[(e, n, "after")].n_params / 1e6, 2),
            }
            for v in ("before", "after"):
                base = med[(args.experts[0], n, v)]["step"]
                m = med[(e, n, v)]
                row[f"{v}_step_ms"] = round(m["step"] * 1e3, 1)
                row[f"{v}_ratio"] = round(m["step"] / base, 2)
                row[f"{v}_optim_ms"] = round(m["optim"] * 1e3, 1)
            row["sync_ms"] = round(med[(e, n, "after")]["sync"] * 1e3, 1)
            after = steps[(e, n, "after")]
            row["total_param_floor_ms"] = round(
                total_parameter_floor_ms(
                    copy.deepcopy(after.policy), after.cfg.algorithm.minibatches
                ),
                1,
            )
            rows.append(row)
    print_table(rows, list(rows[0]))
    payload = {"args": vars(args), "rows": rows, "environment": environment()}
    write_results("active_params", payload)
    return payload


if __name__ == "__main__":
    main()
