"""Rollout throughput: our engine with a static KV cache vs full recompute, and
vs transformers' ``generate()`` on the same tiny MoE.

Tiny preset: 2 layers, d_model 128, 4 heads, 8 experts top-2, expert width
256, batch 64, prompt 16, 16 new tokens, random weights. transformers runs a
MixtralForCausalLM with the same dimensions in fp32 (its default), sampling,
exactly 16 new tokens. Target: >= 1.3x generate()'s generated tokens/s.

    python -m bench.bench_rollout [--threads 2] [--repeats 7]

Besides wall time (noisy on a shared machine) it counts the aten ops each
variant dispatches per call: decode at this size is bound by per-op
overhead, and the count does not depend on machine load.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.common import paired_ratio, print_table, time_interleaved_samples, write_results
from trainer.config import ModelConfig
from trainer.model import TransformerLM
from trainer.rollout import RolloutEngine

BATCH, PROMPT, NEW_TOKENS, VOCAB = 64, 16, 16, 32
TINY = ModelConfig(
    n_layers=2, d_model=128, n_heads=4, n_experts=8, top_k=2, expert_hidden=256, max_seq_len=64
)


def our_generate(precision: str, use_kv_cache: bool, prompt, mask) -> Callable[[], object]:
    torch.manual_seed(0)
    model = TransformerLM(TINY, VOCAB)
    engine = RolloutEngine(TINY, VOCAB, precision=precision)
    engine.load_weights(model.state_dict())

    def run():
        g = torch.Generator().manual_seed(0)
        batch = engine.generate(
            prompt, mask, NEW_TOKENS, temperature=1.0, generator=g, use_kv_cache=use_kv_cache
        )
        assert batch.tokens.shape[1] == PROMPT + NEW_TOKENS

    return run


def hf_generate(prompt, mask) -> Callable[[], object] | None:
    try:
        from transformers import MixtralConfig, MixtralForCausalLM
        from transformers.utils import logging
    except ImportError:
        return None
    logging.set_verbosity_error()
    config = MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=TINY.d_model,
        intermediate_size=TINY.expert_hidden,
        num_hidden_layers=TINY.n_layers,
        num_attention_heads=TINY.n_heads,
        num_key_value_heads=TINY.n_heads,
        num_local_experts=TINY.n_experts,
        num_experts_per_tok=TINY.top_k,
        max_position_embeddings=TINY.max_seq_len,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    torch.manual_seed(0)
    model = MixtralForCausalLM(config).eval()

    def run():
        with torch.no_grad():
            out = model.generate(
                input_ids=prompt,
                attention_mask=mask.long(),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
            )
        assert out.shape[1] == PROMPT + NEW_TOKENS

    return run


class _OpCounter(TorchDispatchMode):
    """Counts aten ops dispatched (kernels and views alike)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    with _OpCounter() as counter:
        fn()
    return counter.count


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--repeats",
        type=int,
        default=7,
        help="rounds of the slow full-recompute variants; the KV-cache variants "
        "and generate() run 3x as many rounds of their own",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, VOCAB, (BATCH, PROMPT), generator=gen)
    mask = torch.ones(BATCH, PROMPT, dtype=torch.bool)
    # The KV-cache variants and generate() (~0.1 s a call) are timed in
    # rounds of their own, so the ratio of each round's back-to-back calls is
    # not diluted by the ~1 s full-recompute calls of a mixed round.
    fast: dict[str, Callable[[], object]] = {
        "ours fp32 kv-cache": our_generate("fp32", True, prompt, mask),
        "ours bf16-emul kv-cache": our_generate("bf16", True, prompt, mask),
    }
    hf = hf_generate(prompt, mask)
    if hf is not None:
        fast["transformers generate()"] = hf
    slow: dict[str, Callable[[], object]] = {
        "ours fp32 recompute": our_generate("fp32", False, prompt, mask),
        "ours bf16-emul recompute": our_generate("bf16", False, prompt, mask),
    }
    samples = time_interleaved_samples(fast, warmup=2, repeats=3 * args.repeats)
    samples |= time_interleaved_samples(slow, warmup=1, repeats=args.repeats)
    fns = fast | slow
    times = {name: statistics.median(ts) for name, ts in samples.items()}
    tokens = BATCH * NEW_TOKENS
    base = times.get("transformers generate()")

    def vs_generate(name: str) -> float | str:
        if not base:
            return ""
        if name in fast:  # same rounds: median of per-round ratios
            return paired_ratio(samples["transformers generate()"], samples[name])
        return base / times[name]

    rows = [
        {
            "variant": name,
            "ms": t * 1e3,
            "tok/s": tokens / t,
            "x generate()": vs_generate(name),
            "aten ops": count_ops(fns[name]),
        }
        for name, t in times.items()
    ]
    print(
        f"tiny MoE: {TINY.n_layers} layers, d {TINY.d_model}, {TINY.n_experts} experts "
        f"top-{TINY.top_k}, batch {BATCH}, prompt {PROMPT}, {NEW_TOKENS} new tokens"
    )
    print_table(rows, ["variant", "ms", "tok/s", "x generate()", "aten ops"])
    summary = {
        "kv_cache_speedup_fp32": times["ours fp32 recompute"] / times["ours fp32 kv-cache"],
        "vs_generate_fp32": vs_generate("ours fp32 kv-cache") if base else None,
        "vs_generate_bf16_emulated": vs_generate("ours bf16-emul kv-cache") if base else None,
    }
    summary["target_met"] = (
        bool(base) and min(summary["vs_generate_fp32"], summary["vs_generate_bf16_emulated"]) >= 1.3
    )
    print()
    for key, value in summary.items():
        print(f"{key}: {value}")
    path = write_results("rollout", {"rows": rows, "summary": summary})
    print(f"\nwrote {path}")
    return summary


if __name__ == "__main__":
    main()
