"""How often half-precision inference routes a token to a different top-k
expert SET than the fp32 training router, per MoE layer (random weights).

For each stack depth and seed: a random-weight tiny MoE (d_model 128, 8
experts top-2, expert width 256), 64 sequences of 48 random tokens; the fp32
training model's natural top-k against the rollout engine's in bf16 and fp16
emulation, teacher-forced on the same tokens (mismatch/routing_inconsistency
per layer).

    python -m bench.bench_routing_flips [--seeds 3]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench.common import print_table, write_results
from trainer.config import ModelConfig
from trainer.model import TransformerLM
from trainer.rollout import RolloutEngine

VOCAB, BATCH, LENGTH = 32, 64, 48


def flip_rates(n_layers: int, precision: str, seed: int) -> list[float]:
    cfg = ModelConfig(
        n_layers=n_layers, d_model=128, n_heads=4, n_experts=8, top_k=2, expert_hidden=256
    )
    torch.manual_seed(seed)
    model = TransformerLM(cfg, VOCAB).eval()
    gen = torch.Generator().manual_seed(seed + 1000)
    tokens = torch.randint(3, VOCAB, (BATCH, LENGTH), generator=gen)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad():
        train = model(tokens, attention_mask=mask, return_routing=True).routing
    engine = RolloutEngine(cfg, VOCAB, precision=precision)
    engine.load_weights(model.state_dict())
    _, packed = engine.score(tokens, mask)
    rates = []
    for engine_idx, layer in zip(packed.unpack(), train, strict=True):
        same = (engine_idx.sort(-1).values == layer.natural_indices.sort(-1).values).all(-1)
        rates.append(1.0 - same[mask].float().mean().item())
    return rates


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for n_layers in (2, 4):
        for precision in ("bf16", "fp16", "fp32"):
            per_seed = [flip_rates(n_layers, precision, seed) for seed in range(args.seeds)]
            per_layer = [statistics.mean(rates) for rates in zip(*per_seed, strict=True)]
            rows.append(
                {
                    "layers": n_layers,
                    "rollout precision": precision,
                    "flip % per layer": "  ".join(
                        f"L{i}:{100 * r:.2f}" for i, r in enumerate(per_layer)
                    ),
                    "mean %": 100 * statistics.mean(per_layer),
                    "_per_layer": per_layer,
                }
            )
    print(
        f"top-2 expert-set disagreement vs the fp32 training router, "
        f"{BATCH}x{LENGTH} tokens, mean of {args.seeds} seeds"
    )
    print_table(rows, ["layers", "rollout precision", "flip % per layer", "mean %"])
    path = write_results("routing_flips", {"rows": rows, "tokens": BATCH * LENGTH})
    print(f"\nwrote {path}")
    return {"rows": rows}


if __name__ == "__main__":
    main()
