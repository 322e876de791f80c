"""RL-step cost at FIXED active parameters as the expert count grows.

Every model routes each token to top-2 experts of the same width, so the
parameters a token uses stay the same while the total grows with the expert
count. One RL step = weight sync into the rollout engine + rollout + the
measurement forward + the update (minibatches), on a fixed prompt batch, without
the warm start. "before" runs the update with the per-parameter (for-loop) AdamW,
"after" with the fused AdamW the trainer now builds.

All configurations are timed in paired rounds (bench.common): each round runs
every configuration once, in a seeded random order, wall and thread CPU time;
a ratio is the median over rounds of the per-round ratio to the 8-expert model
of the same depth and optimiser, with its order-statistic 95% interval. On a
loaded machine trust the CPU-time columns. Where the extra cost goes (the
total-parameter floor, AdamW variants, the per-expert GEMMs):
bench/bench_expert_cost.py.

    .venv/bin/python -m bench.bench_active_params [--experts 8 16 32 64] [--layers 2 8]
"""

from __future__ import annotations

import argparse
import copy

import torch

from bench.common import (
    Rounds,
    Stopwatch,
    Timing,
    print_table,
    round_orders,
    set_threads,
    write_results,
)
from trainer.config import ExperimentConfig
from trainer.rollout import RolloutEngine
from trainer.rollout.data import RolloutData
from trainer.run.measure_step import measure_batch
from trainer.run.update import PolicyUpdater

VOCAB = 32
PARTS = ("step", "sync", "optim")


def add_step_args(parser: argparse.ArgumentParser) -> None:
    """The model and batch options shared with bench_expert_cost."""
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--expert-hidden", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)


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
        self.parts: dict[str, list[Timing]] = {part: [] for part in PARTS}

    def run(self) -> Timing:
        """One step; appends its whole, weight-sync and optimiser times to ``parts``."""
        whole = Stopwatch()
        self.engine.load_weights(self.policy.state_dict())
        sync = whole.elapsed()
        rollout = self.engine.generate(
            self.prompts, self.prompt_mask, max_new_tokens=self.cfg.rollout.max_new_tokens,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        rewards = torch.arange(rollout.tokens.shape[0], dtype=torch.float32) % 3
        data = RolloutData.from_rollout(rollout, rewards)
        self.updater.stabilizers.begin_step(0, data)
        measure_batch(self.cfg, self.policy, self.updater, data)
        opt = self.updater.optimizer
        spent = [0.0, 0.0]
        original = opt.step

        def timed_step(*a, **kw):
            watch = Stopwatch()
            out = original(*a, **kw)
            t = watch.elapsed()
            spent[0] += t.wall
            spent[1] += t.cpu
            return out

        opt.step = timed_step
        try:
            self.updater.update(data, 0, lr=1e-4, entropy_coef=0.0)
        finally:
            opt.step = original
        step = whole.elapsed()
        for part, t in (("step", step), ("sync", sync), ("optim", Timing(*spent))):
            self.parts[part].append(t)
        return step


def name_of(experts: int, layers: int, variant: str) -> str:
    return f"L{layers}-E{experts}-{variant}"


def time_steps(steps: dict[str, Step], rounds: int, seed: int = 0) -> Rounds:
    """One warm-up step each, then ``rounds`` paired rounds in a random order."""
    for step in steps.values():  # warm-up: allocator, kernels
        step.run()
    for step in steps.values():
        step.parts = {part: [] for part in PARTS}
    timed = Rounds(list(steps))
    for order in round_orders(list(steps), rounds, "random", seed):
        timed.begin_round(order)
        for name in order:
            timed.add(name, steps[name].run())
    return timed.finish()


def part_median_ms(step: Step, part: str, clock: str) -> float:
    values = sorted(getattr(t, clock) for t in step.parts[part])
    n = len(values)
    return 1e3 * (values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2)


def table(steps: dict[str, Step], timed: Rounds, args) -> list[dict[str, object]]:
    experts, layers, variants = args.experts, args.layers, args.variants
    rows = []
    for n in layers:
        for e in experts:
            row: dict[str, object] = {
                "layers": n,
                "experts": e,
                "params_M": round(steps[name_of(e, n, variants[-1])].n_params / 1e6, 2),
            }
            for v in variants:
                name, base = name_of(e, n, v), name_of(experts[0], n, v)
                row[f"{v}_wall_ms"] = round(timed.median(name, "wall") * 1e3, 1)
                row[f"{v}_cpu_ms"] = round(timed.median(name, "cpu") * 1e3, 1)
                row[f"{v}_x_wall"] = str(timed.ratio(name, base, "wall"))
                row[f"{v}_x_cpu"] = str(timed.ratio(name, base, "cpu"))
                row[f"{v}_optim_cpu_ms"] = round(part_median_ms(steps[name], "optim", "cpu"), 1)
            last = steps[name_of(e, n, variants[-1])]
            row["sync_cpu_ms"] = round(part_median_ms(last, "sync", "cpu"), 1)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--experts", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8])
    parser.add_argument(
        "--variants", nargs="+", default=["before", "after"], choices=["before", "after"]
    )
    parser.add_argument("--rounds", "--repeats", type=int, default=5, dest="rounds")
    add_step_args(parser)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    steps = {
        name_of(e, n, v): Step(e, n, v == "after", args)
        for n in args.layers
        for e in args.experts
        for v in args.variants
    }
    timed = time_steps(steps, args.rounds)
    rows = table(steps, timed, args)
    print(timed.load_line())
    short = ["layers", "experts", "params_M"] + [
        f"{v}_{c}" for v in args.variants for c in ("cpu_ms", "x_cpu", "wall_ms", "x_wall")
    ]
    print_table(rows, short)
    optim = [f"{v}_optim_cpu_ms" for v in args.variants]
    print_table(rows, ["layers", "experts", *optim, "sync_cpu_ms"])
    payload = {"args": vars(args), "rows": rows, "rounds": timed.record()}
    write_results("active_params", payload)
    return payload


if __name__ == "__main__":
    main()
