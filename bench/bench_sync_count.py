"""Host syncs per RL step, by phase, counted on the CPU (trainer.devices.sync_count).

Builds a run of a preset exactly as ``trainer run`` does (warm start, policy,
engine, updater), then runs RL steps with every would-be device-to-host sync
counted and labelled with its phase: weight sync, rollout (prefill, decode,
sampling, the stop checks), scoring the responses (decoding text on the host:
one read of the token batch), measure (the mismatch forward and its
statistics), update (every minibatch), and the step's own bookkeeping. Also
counted on their own: one MoE training forward, and one engine decode step.

    .venv/bin/python -m bench.bench_sync_count moe-grpo --steps 2
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch

from bench.common import write_results
from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.devices.sync_count import SyncCount, count_syncs
from trainer.run import runner
from trainer.run.context import build_context
from trainer.validation import validate_config

# Small enough for a test: 4 prompts x 4 answers, a short warm start.
FAST = [
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "algorithm.minibatches=2",
    "warm_start.max_steps=20",
    "warm_start.eval_every=20",
    "warm_start.eval_size=8",
    "task.eval_size=8",
    "run.threads=1",
]


def _phased(count: SyncCount, phase: str, fn):
    def wrapped(*args, **kwargs):
        with count.in_phase(phase):
            return fn(*args, **kwargs)

    return wrapped


def step_syncs(preset: str, steps: int = 1, overrides: list[str] | None = None) -> dict:
    """Syncs per RL step by phase (the median step's), per kind, and the call sites."""
    cfg = validate_config(apply_overrides(preset_dict(preset), FAST + list(overrides or [])))
    ctx = build_context(cfg, log=lambda _line: None)
    per_step = []
    for step in range(steps):
        with ExitStack() as stack:
            count = stack.enter_context(count_syncs())
            stack.enter_context(count.in_phase("bookkeeping"))
            ctx_sync = ctx.sync_engine
            stack.enter_context(
                mock.patch.object(ctx, "sync_engine", _phased(count, "weight_sync", ctx_sync))
            )
            stack.enter_context(
                mock.patch.object(
                    ctx.engine, "generate", _phased(count, "rollout", ctx.engine.generate)
                )
            )
            stack.enter_context(
                mock.patch.object(
                    runner,
                    "decode_responses",
                    _phased(count, "score", runner.decode_responses),
                )
            )
            stack.enter_context(
                mock.patch.object(
                    runner, "measure_batch", _phased(count, "measure", runner.measure_batch)
                )
            )
            stack.enter_context(
                mock.patch.object(
                    ctx.updater, "update", _phased(count, "update", ctx.updater.update)
                )
            )
            runner._rl_step(ctx, step)
        per_step.append(count)
    last = per_step[-1]
    return {
        "preset": preset,
        "minibatches": cfg.algorithm.minibatches,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "stop_check_every": ctx.engine.stop_check_every,
        "by_phase": dict(last.by_phase),
        "by_kind": dict(last.by_kind),
        "total": last.total,
        "sites": dict(Counter(f"{phase_kind}" for phase_kind in _site_lines(last))),
        "moe_forward": moe_forward_syncs(ctx),
        "decode_step": decode_step_syncs(ctx),
    }


def _site_lines(count: SyncCount):
    for kind, site in count.sites:
        yield f"{kind} at {site}"


def moe_forward_syncs(ctx) -> int:
    """Syncs of one training forward + backward of the policy on a rollout-shaped batch."""
    tokens = torch.randint(3, 10, (4, 12), device=ctx.device)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    with count_syncs() as count:
        out = ctx.policy(tokens, attention_mask=mask, return_routing=True)
        out.logits.float().square().mean().backward()
    ctx.policy.zero_grad(set_to_none=True)
    return count.total


def decode_step_syncs(ctx) -> int:
    """Syncs of one cached engine decode step (``_decode``) after a prefill."""
    engine = ctx.engine
    prompts = torch.randint(3, 10, (4, 6), device=ctx.device)
    mask = torch.ones_like(prompts, dtype=torch.bool)
    engine.generate(prompts, mask, max_new_tokens=2, temperature=1.0, eos_id=None)
    with torch.inference_mode(), count_syncs() as count:
        n_real, key_bias = engine._decode_state(mask, 8)
        engine.forward_pass.decode(prompts[:, -1], n_real, 6, key_bias[:, None, None, :7], None)
    return count.total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", nargs="?", default="moe-grpo")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="config override a.b=v")
    args = parser.parse_args()
    result = step_syncs(args.preset, args.steps, args.set)
    print(json.dumps({k: v for k, v in result.items() if k != "sites"}, indent=2))
    print("call sites:")
    for line, n in sorted(result["sites"].items(), key=lambda kv: -kv[1]):
        print(f"{n:5d}  {line}")
    write_results(Path(__file__).stem, result)


if __name__ == "__main__":
    main()
