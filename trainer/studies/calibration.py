"""Gap calibration: (engine precision, router noise sigma) -> routing gap, k3 and SDI on a
base, and the base's balance.

For one warm-started base and each precision and sigma, the rollout engine
(that precision: fp32 for the routing-only dose, bf16 or fp8 for the real
engine gap a GPU study measures; router noise sigma) samples a batch of responses as a run's first step does, and one
training forward on those tokens measures the gap exactly as the run logs it
(``trainer.algorithms.measure``): the share of (token, MoE layer) pairs routed
differently, the k3 KL between training and rollout log-probs, the sequence
disagreement index. The base's own expert balance on the same tokens comes
with it: dead experts (load under a tenth of the balanced share), the load
entropy (normalised: 1 = balanced) and MaxVio, per layer and overall.

    python -m trainer calibrate --study causal --bases 0,1,2,3 \\
        --sigmas 0,0.05,0.1,0.2,0.4 --out docs/results/causal/calibration.json
    python -m trainer calibrate --study gpu-mismatch --bases 0,1,2,3 --sigmas 0 \\
        --precisions fp32,bf16,fp8 --out OUT/calibration.json      # on the GPU
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trainer import metric_keys as K
from trainer.algorithms.losses import gather_logprobs
from trainer.algorithms.measure import expert_load, mismatch_stats, routing_mismatch
from trainer.config import ExperimentConfig
from trainer.rollout import RolloutEngine
from trainer.rollout.router_noise import RouterNoise, noise_seed
from trainer.run.batches import collate_prompts, repeat_for_groups
from trainer.tasks import make_task

DEAD_SHARE = 0.1  # an expert with under a tenth of the balanced load is dead


def balance_of(loads: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Per-layer loads (shares summing to 1) -> dead experts, normalised entropy, MaxVio."""
    per_layer = []
    for load in loads:
        e = len(load)
        fair = 1.0 / e
        entropy = -sum(p * math.log(p) for p in load if p > 0) / math.log(e)
        per_layer.append(
            {
                "dead": sum(p < DEAD_SHARE * fair for p in load),
                "min_share_of_fair": min(load) / fair,
                "entropy": entropy,
                "max_violation": (max(load) - fair) / fair,
            }
        )
    return {
        "dead_experts": sum(layer["dead"] for layer in per_layer),
        "load_entropy": sum(layer["entropy"] for layer in per_layer) / len(per_layer),
        "max_violation": sum(layer["max_violation"] for layer in per_layer) / len(per_layer),
        "layers": per_layer,
    }


@torch.no_grad()
def calibrate_base(
    cfg: ExperimentConfig,
    sigmas: Sequence[float],
    batches: int = 2,
    seed: int = 0,
    kind: str = "fixed",
    precisions: Sequence[str] = ("fp32",),
) -> dict[str, Any]:
    """Gap measures per engine precision and sigma on the base of ``cfg`` (trained or
    read from the cache), on the run's device (``run.device``)."""
    from trainer.hf.loader import build_model
    from trainer.run.context import resolve_device
    from trainer.run.warmstart import train_base_policy

    device = resolve_device(cfg.run.device)
    task = make_task(cfg.task)
    vocab = cfg.model.vocab_size or task.tokenizer.vocab_size
    with torch.enable_grad():  # an uncached base trains here (SFT needs gradients)
        base = train_base_policy(cfg, task, vocab, device=device, log=lambda *_: None)
    policy = build_model(cfg.model, vocab, device=device)
    policy.load_state_dict(base.state_dict)
    policy.eval()
    tok = task.tokenizer
    n_moe = cfg.model.n_moe_blocks
    out: dict[str, Any] = {"base_accuracy": base.accuracy, "sigmas": []}
    loads_total: list[torch.Tensor] | None = None
    first = True
    for precision, sigma in [(p, s) for p in precisions for s in sigmas]:
        # The projections every run on this base draws (trainer.rollout.router_noise.noise_seed).
        noise = RouterNoise(
            sigma,
            kind,
            n_moe,
            cfg.model.d_model,
            cfg.model.n_experts,
            seed=noise_seed(cfg),
            device=device,
        )
        engine = RolloutEngine(
            cfg.model, vocab, precision=precision, device=device, router_noise=noise
        )
        engine.load_weights(policy.state_dict())
        rng = random.Random(seed)
        gen = torch.Generator(device=device).manual_seed(seed)
        sums: dict[str, float] = {}
        for _ in range(batches):
            problems = repeat_for_groups(
                task.sample(cfg.rollout.prompts_per_step, rng), cfg.rollout.group_size
            )
            prompts, mask = collate_prompts(problems, tok, device)
            batch = engine.generate(
                prompts,
                mask,
                max_new_tokens=cfg.rollout.max_new_tokens,
                temperature=cfg.rollout.temperature,
                eos_id=tok.stop_ids,
                pad_id=tok.pad_id,
                generator=gen,
            )
            train = policy(batch.tokens, attention_mask=batch.attention_mask, return_routing=True)
            train_logp = gather_logprobs(train.logits / cfg.rollout.temperature, batch.tokens)
            stats = mismatch_stats(train_logp, batch.logprobs, batch.response_mask)
            seen = batch.attention_mask & batch.routing_mask
            natural = [r.natural_indices for r in train.routing]
            stats.update(routing_mismatch(natural, batch.routing.unpack(), seen))
            stats["response_tokens"] = float(batch.response_mask.sum(-1).float().mean())
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value / batches
            if first:
                layer_loads = [
                    expert_load(idx, batch.attention_mask, cfg.model.n_experts) for idx in natural
                ]
                loads_total = (
                    layer_loads
                    if loads_total is None
                    else [a + b for a, b in zip(loads_total, layer_loads, strict=True)]
                )
        first = False
        out["sigmas"].append(
            {
                "precision": precision,
                "sigma": sigma,
                "routing_inconsistency": sums[K.MISMATCH_ROUTING_INCONSISTENCY],
                "token_any_layer": sums[K.MISMATCH_TOKEN_ANY_LAYER_FRAC],
                "sdi": sums[K.MISMATCH_SDI],
                "kl_k3": sums[K.MISMATCH_KL_K3],
                "kl_k1": sums[K.MISMATCH_KL_K1],
                "response_tokens": sums["response_tokens"],
            }
        )
    loads = [(load / load.sum()).tolist() for load in loads_total or []]
    out["balance"] = balance_of(loads) if loads else None
    return out


def markdown_table(by_base: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| base | held-out at start | dead experts | load entropy | MaxVio | engine | sigma | "
        "routing % | "
        "any layer % | SDI % | k3 x1e-3 | response tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for base, result in by_base.items():
        bal = result["balance"]
        for i, row in enumerate(result["sigmas"]):
            head = (
                f"| {base} | {result['base_accuracy']:.3f} | {bal['dead_experts']} | "
                f"{bal['load_entropy']:.3f} | {bal['max_violation']:.2f} |"
                if i == 0
                else "| | | | | |"
            )
            lines.append(
                f"{head} {row.get('precision', 'fp32')} | {row['sigma']:g} | "
                f"{100 * row['routing_inconsistency']:.2f} | "
                f"{100 * row['token_any_layer']:.1f} | {100 * row['sdi']:.2f} | "
                f"{1e3 * row['kl_k3']:.3f} | {row['response_tokens']:.1f} |"
            )
    return "\n".join(lines)


def calibrate_study(
    study,
    bases: Sequence[int],
    sigmas: Sequence[float],
    out: Path,
    batches: int = 2,
    kind: str = "fixed",
    variant: str | None = None,
    precisions: Sequence[str] = ("fp32",),
) -> str:
    """Calibrate ``study``'s first MoE variant (or ``variant``) on each base; write
    ``out`` (JSON) and the markdown table beside it; returns the table."""
    torch.set_num_threads(1)  # the runs' thread count: the same cached bases
    chosen = next(
        v
        for v in study.variants
        if (variant is None and study.config_for(v, 0).model.is_moe) or v.name == variant
    )
    by_base = {}
    for base in bases:
        cfg = study.config_for(chosen, base)
        by_base[str(base)] = calibrate_base(
            cfg, sigmas, batches=batches, kind=kind, precisions=precisions
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(by_base, indent=1))
    table = markdown_table(by_base)
    out.with_suffix(".md").write_text(table + "\n")
    return table
