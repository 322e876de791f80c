"""Rollout throughput: our engine with a static KV cache vs full recompute, and
vs transformers' ``generate()`` on the same tiny MoE.

Tiny preset: 2 layers, d_model 128, 4 heads, 8 experts top-2, expert width
256, batch 64, prompt 16, 16 new tokens, random weights. transformers runs a
MixtralForCausalLM with the same dimensions in fp32 (its default), sampling,
exactly 16 new tokens. Target: >= 1.3x generate()'s generated tokens/s.

    python -m bench.bench_rollout [--threads 1] [--repeats 7]

Timed in paired rounds (bench.common.run_rounds), wall and thread CPU time;
"x generate()" is the median over rounds of generate()'s time over ours in the
same round, with its 95% order-statistic interval (trust the CPU-time one on a
loaded machine). It also counts the aten ops each variant dispatches per call:
decode at this size is bound by per-op overhead, and the count does not depend
on machine load.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.common import print_table, run_rounds, set_threads, write_results
from trainer.config import ModelConfig
from trainer.model import TransformerLM
from trainer.rollout import RolloutEngine

BATCH, PROMPT, NEW_TOKENS, VOCAB = 64, 16, 16, 32
GENERATE = "transformers generate()"
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
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--repeats",
        type=int,
        default=7,
        help="rounds of the slow full-recompute variants; the KV-cache variants "
        "and generate() run 3x as many rounds of their own",
    )
    args = parser.parse_args(argv)
    set_threads(args.threads)

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
        fast[GENERATE] = hf
    slow: dict[str, Callable[[], object]] = {
        "ours fp32 recompute": our_generate("fp32", False, prompt, mask),
        "ours bf16-emul recompute": our_generate("bf16", False, prompt, mask),
    }
    fast_rounds = run_rounds(fast, 3 * args.repeats, warmup=2)
    slow_rounds = run_rounds(slow, args.repeats, warmup=1)
    fns = fast | slow
    tokens = BATCH * NEW_TOKENS
    rows = []
    for rounds in (fast_rounds, slow_rounds):
        for name in rounds.names:
            row: dict[str, object] = {
                "variant": name,
                "wall_ms": rounds.median(name, "wall") * 1e3,
                "cpu_ms": rounds.median(name, "cpu") * 1e3,
                "tok/cpu-s": tokens / rounds.median(name, "cpu"),
            }
            if hf is not None and rounds is fast_rounds:  # same rounds: paired ratio
                row["x gen wall"] = str(fast_rounds.ratio(GENERATE, name, "wall"))
                row["x gen cpu"] = str(fast_rounds.ratio(GENERATE, name, "cpu"))
            row["aten ops"] = count_ops(fns[name])
            rows.append(row)
    print(
        f"tiny MoE: {TINY.n_layers} layers, d {TINY.d_model}, {TINY.n_experts} experts "
        f"top-{TINY.top_k}, batch {BATCH}, prompt {PROMPT}, {NEW_TOKENS} new tokens"
    )
    print(fast_rounds.load_line())
    columns = ["variant", "wall_ms", "cpu_ms", "tok/cpu-s", "x gen wall", "x gen cpu", "aten ops"]
    print_table(rows, columns)
    summary: dict[str, object] = {
        "kv_cache_speedup_fp32_cpu": slow_rounds.median("ours fp32 recompute")
        / fast_rounds.median("ours fp32 kv-cache"),
    }
    if hf is not None:
        for key, name in (
            ("fp32", "ours fp32 kv-cache"),
            ("bf16_emulated", "ours bf16-emul kv-cache"),
        ):
            summary[f"vs_generate_{key}_cpu"] = fast_rounds.ratio(GENERATE, name, "cpu").as_dict()
            summary[f"vs_generate_{key}_wall"] = fast_rounds.ratio(GENERATE, name, "wall").as_dict()
        summary["target_met_cpu"] = (
            min(summary["vs_generate_fp32_cpu"]["median"],
                summary["vs_generate_bf16_emulated_cpu"]["median"]) >= 1.3
        )  # fmt: skip
    print()
    for key, value in summary.items():
        print(f"{key}: {value}")
    payload = {
        "args": vars(args),
        "rows": rows,
        "summary": summary,
        "kv_cache_rounds": fast_rounds.record(baseline=GENERATE if hf is not None else None),
        "recompute_rounds": slow_rounds.record(),
    }
    path = write_results("rollout", payload)
    print(f"\nwrote {path}")
    return summary


if __name__ == "__main__":
    main()
