"""Cost of Rollout Routing Replay (R3, arXiv 2510.11370): step time and storage.

1. Step time, R3 vs no replay, on the tiny MoE preset: the loop's own step
   (``trainer.run.runner._rl_step``: rollout, packed routing transport, measure
   forward, update) with the same weights, the same seeds and hence the same
   rollout for both variants; before every timed step the policy, optimiser and
   generators are restored, so each variant repeats exactly the same work.
   Steps are interleaved (none, r3, none, r3, ...) so load from other processes
   hits both alike. The overhead is the median over repeats of the PAIRED ratio
   r3_i / none_i - 1 (adjacent steps share the machine's load of the moment);
   medians and minima of each variant are printed too. Target: at most 3%.
2. Storage: bytes per (token, MoE layer) of the routing the engine recorded in
   one rollout, packed at ceil(log2 E) bits per index, run-length encoded and
   zlib-compressed, against the information bound log2 C(E, k); and the time to
   pack + unpack one batch. "grid" is what travels (the whole (B, T) batch, pads
   included, as the metric r3/bytes_per_token_layer counts it); "tokens" packs
   only the token-layers the engine routed, the fair comparison with the bound.

    python -m bench.bench_r3_overhead [--repeats 30] [--threads 1] [--preset moe-grpo]

Writes bench/results/r3_overhead.json.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import random
import statistics
import time

import torch

from bench.common import print_table, write_results
from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.config.validation import validate_config
from trainer.model import TransformerLM
from trainer.rollout import RolloutEngine
from trainer.rollout.routing_pack import pack_routing, storage_report, unpack_routing
from trainer.run.batches import collate_prompts, repeat_for_groups
from trainer.run.runner import _rl_step
from trainer.run.update import PolicyUpdater
from trainer.tasks import make_task

TARGET_OVERHEAD = 0.03


class Variant:
    """One config's policy, engine and updater, restorable to the same start state."""

    def __init__(self, cfg, task, vocab_size: int, weights: dict[str, torch.Tensor]):
        self.cfg = cfg
        self.task = task
        self.policy = TransformerLM(cfg.model, vocab_size)
        self.policy.load_state_dict(weights)
        self.engine = RolloutEngine(cfg.model, vocab_size, precision=cfg.rollout.precision)
        self.py_rng = random.Random(cfg.run.seed)
        self.generators = {
            "sample": torch.Generator().manual_seed(cfg.run.seed),
            "shuffle": torch.Generator().manual_seed(cfg.run.seed + 1),
        }
        self.updater = PolicyUpdater(cfg, self.policy, None, self.generators["shuffle"])
        self._start = (
            copy.deepcopy(self.policy.state_dict()),
            copy.deepcopy(self.updater.state_dict()),
            self.py_rng.getstate(),
            {name: g.get_state() for name, g in self.generators.items()},
        )

    def restore(self) -> None:
        policy, updater, py_state, generators = self._start
        self.policy.load_state_dict(policy)
        self.updater.load_state_dict(copy.deepcopy(updater))
        self.py_rng.setstate(py_state)
        for name, g in self.generators.items():
            g.set_state(generators[name])

    def step(self) -> tuple[float, dict]:
        """Seconds of one loop step (the step's own wall clock) and its metrics."""
        start = time.perf_counter()
        metrics = _rl_step(
            self.cfg, 0, self.task, self.policy, self.engine, self.updater,
            self.py_rng, self.generators, torch.device("cpu"),
        )  # fmt: skip
        return time.perf_counter() - start, metrics


def time_steps(
    variants: dict[str, Variant], warmup: int, repeats: int
) -> dict[str, dict[str, list[float]]]:
    """Per variant, per part (step, rollout, measure, update): seconds of each repeat."""
    samples: dict[str, dict[str, list[float]]] = {
        name: {"step": [], "rollout": [], "measure": [], "update": []} for name in variants
    }
    for i in range(warmup + repeats):
        for name, variant in variants.items():
            variant.restore()
            seconds, metrics = variant.step()
            if i >= warmup:
                s = samples[name]
                s["step"].append(seconds)
                s["rollout"].append(metrics["time/rollout_s"])
                s["measure"].append(metrics["time/mismatch_s"])
                s["update"].append(metrics["time/train_s"])
    return samples


def paired_overhead(r3: list[float], none: list[float]) -> tuple[float, float, float]:
    """Median and quartiles over repeats of r3_i / none_i - 1: (median, q1, q3)."""
    ratios = [a / b - 1.0 for a, b in zip(r3, none, strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return median, q1, q3


def storage_rows(variant: Variant, repeats: int) -> list[dict]:
    """Storage of one step's recorded routing under each compression."""
    cfg, task = variant.cfg, variant.task
    variant.restore()
    variant.engine.load_weights(variant.policy.state_dict())
    problems = repeat_for_groups(
        task.sample(cfg.rollout.prompts_per_step, random.Random(0)), cfg.rollout.group_size
    )
    prompts, mask = collate_prompts(problems, task.tokenizer, torch.device("cpu"))
    rollout = variant.engine.generate(
        prompts, mask, max_new_tokens=cfg.rollout.max_new_tokens,
        eos_id=task.tokenizer.eos_id, pad_id=task.tokenizer.pad_id,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    grid = list(rollout.routing.indices.unbind(0))  # (B, T, k) per layer, pads included
    routed = rollout.routing.routing_mask
    tokens = [idx[routed].unsqueeze(0) for idx in grid]  # (1, N, k): routed tokens only
    rows = []
    for (layout, indices), compression in itertools.product(
        (("grid", grid), ("tokens", tokens)), ("none", "rle", "zlib")
    ):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            packed = pack_routing(indices, cfg.model.n_experts, compression)
            unpack_routing(packed)
            times.append(time.perf_counter() - start)
        report = storage_report(packed)
        rows.append(
            {
                "layout": layout,
                "compression": compression,
                "experts": cfg.model.n_experts,
                "top_k": cfg.model.top_k,
                "bytes_per_token_layer": packed.bytes_per_token_layer,
                "bits_per_token_layer": report["bits_per_token_layer"],
                "bound_bits": report["bound_bits"],
                "ratio_to_bound": report["ratio_to_bound"],
                "engine_uint8_bytes": float(rollout.routing.bytes_per_token_layer),
                "pack_unpack_ms": 1000 * statistics.median(times),
                "token_layers": packed.n_token_layers,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="moe-grpo")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    # 1 thread: on a shared, loaded 2-core machine 2 threads mostly measure contention.
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    base = validate_config(apply_overrides(preset_dict(args.preset), ["algorithm.kl_coef=0"]))
    task = make_task(base.task)
    vocab_size = base.model.vocab_size or task.tokenizer.vocab_size
    torch.manual_seed(base.run.seed)
    weights = TransformerLM(base.model, vocab_size).state_dict()
    variants = {
        mode: Variant(
            validate_config(apply_overrides(base.to_dict(), [f"stabilizers.replay.mode={mode}"])),
            task,
            vocab_size,
            weights,
        )
        for mode in ("none", "r3")
    }
    samples = time_steps(variants, args.warmup, args.repeats)
    overhead, q1, q3 = paired_overhead(samples["r3"]["step"], samples["none"]["step"])

    def trainer_side(name: str) -> list[float]:
        return [
            a + b for a, b in zip(samples[name]["measure"], samples[name]["update"], strict=True)
        ]

    trainer_overhead = paired_overhead(trainer_side("r3"), trainer_side("none"))[0]
    time_rows = [
        {
            "replay": name,
            **{f"{part}_ms": 1000 * statistics.median(v) for part, v in parts.items()},
            "step_min_ms": 1000 * min(parts["step"]),
        }
        for name, parts in samples.items()
    ]
    print(
        f"R3 step-time overhead, preset {args.preset} ({base.rollout.prompts_per_step}x"
        f"{base.rollout.group_size} sequences, {base.algorithm.minibatches} minibatches), "
        f"{args.threads} threads, median of {args.repeats} interleaved steps"
    )
    print_table(
        time_rows, ["replay", "step_ms", "step_min_ms", "rollout_ms", "measure_ms", "update_ms"]
    )
    verdict = "met" if overhead <= TARGET_OVERHEAD else "NOT met"
    print(f"overhead (median paired ratio): step {100 * overhead:+.2f}% "
          f"(quartiles {100 * q1:+.1f}% .. {100 * q3:+.1f}%; target <= 3%: {verdict}); "
          f"measure + update only {100 * trainer_overhead:+.2f}%\n")  # fmt: skip

    storage = storage_rows(variants["r3"], args.repeats)
    sixteen = validate_config(
        apply_overrides(base.to_dict(), ["model.n_experts=16", "model.expert_hidden=128"])
    )
    torch.manual_seed(base.run.seed)
    sixteen_weights = TransformerLM(sixteen.model, vocab_size).state_dict()
    storage += storage_rows(Variant(sixteen, task, vocab_size, sixteen_weights), args.repeats)
    print("Routing storage per (token, MoE layer), one rollout of the preset's batch")
    print_table(
        storage,
        ["experts", "top_k", "layout", "compression", "bytes_per_token_layer", "bits_per_token_layer",
         "bound_bits", "ratio_to_bound", "engine_uint8_bytes", "pack_unpack_ms"],
    )  # fmt: skip
    result = {
        "preset": args.preset,
        "repeats": args.repeats,
        "step_time": time_rows,
        "overhead_step": overhead,
        "overhead_step_quartiles": [q1, q3],
        "overhead_measure_update": trainer_overhead,
        "threads": args.threads,
        "target_overhead": TARGET_OVERHEAD,
        "target_met": overhead <= TARGET_OVERHEAD,
        "storage": storage,
    }
    path = write_results("r3_overhead", result)
    print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
