"""One decode step of the rollout engine: eager against ``torch.compile`` on the CPU.

Variants, per model shape, one thread, inference mode, the same cache column
each call (a step's cost does not depend on which column it writes):

* ``eager``: the engine's own ``_decode`` (cache slice up to the column, the
  experts on ``grouped_mm``): what rollouts run today;
* ``static-grouped``: ``decode_static`` eager, over the whole cache width,
  experts still on ``grouped_mm`` (what the wider attention alone costs);
* ``static``: the same with the experts on ``padded`` (the form that compiles
  for fp32: torch's grouped_mm compiles for bf16 only);
* ``compiled``: ``decode_static`` under ``torch.compile(dynamic=False)``
  (inductor's C++ backend on the CPU), compile time reported apart.

Paired rounds with wall and thread CPU time and the load recorded
(bench/common.py): the ratios are medians of per-round ratios with an
interval, and CPU time is the figure to trust on a busy machine. Also records how many graphs the compiled step
built over a whole rollout's columns (1 = no recompilation per token).

    .venv/bin/python -m bench.bench_decode_compile [--quick]
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.common import print_table, run_rounds, set_threads, write_results
from trainer.config.presets import resolve_preset
from trainer.model import TransformerLM
from trainer.rollout.engine import RolloutEngine
from trainer.rollout.static_decode import compiled_decode, decode_static, zero_cache

VOCAB = 64
SHAPES = {
    # the study's tiny MoE (2 layers, 8 experts top-2, d_model 64), 64 rows
    "tiny-moe": ({}, 64),
    # a wider MoE: 4 layers, d_model 256, 16 experts top-2, 64 rows
    "moe-256": ({"n_layers": 4, "d_model": 256, "n_heads": 4, "n_experts": 16, "expert_hidden": 256}, 64),
}  # fmt: skip
PROMPT, NEW = 16, 32


def _engine(model: dict, backend: str) -> RolloutEngine:
    cfg = resolve_preset("moe-grpo").model.model_copy(update=model)
    torch.manual_seed(0)
    policy = TransformerLM(cfg, VOCAB)
    engine = RolloutEngine(cfg, VOCAB, precision="fp32", moe_backend=backend)
    engine.load_weights(policy.state_dict())
    return engine


def _ready(engine: RolloutEngine, rows: int):
    """Cache, rope table and decode state of a rollout of ``rows`` x (PROMPT + NEW)."""
    total = PROMPT + NEW
    engine.forward_pass.static_cache(rows, total)
    engine.forward_pass.rope_table(total)
    zero_cache(engine)
    mask = torch.ones((rows, PROMPT), dtype=torch.bool)
    n_real, key_bias = engine._decode_state(mask, total)
    routing = engine._routing_buffer(rows, total)
    return n_real, key_bias, routing


def bench_shape(name: str, model: dict, rows: int, repeats: int) -> dict:
    eager, static_grouped, static, compiled_engine = (
        _engine(model, "auto"),
        _engine(model, "auto"),
        _engine(model, "padded"),
        _engine(model, "padded"),
    )
    token = torch.randint(3, VOCAB, (rows,), generator=torch.Generator().manual_seed(1))
    col = PROMPT + NEW // 2
    with torch.inference_mode():
        col_t = torch.tensor([col])  # made in inference mode, as a rollout makes it
        e_real, e_bias, e_routing = _ready(eager, rows)
        g_real, g_bias, g_routing = _ready(static_grouped, rows)
        s_real, s_bias, s_routing = _ready(static, rows)
        c_real, c_bias, c_routing = _ready(compiled_engine, rows)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        step = compiled_decode(compiled_engine)
        t0 = time.perf_counter()
        step(token, c_real, col_t, c_bias, c_routing)
        compile_s = time.perf_counter() - t0
        for c in range(PROMPT, PROMPT + NEW - 1):  # a whole rollout's columns
            step(token, c_real, torch.tensor([c]), c_bias, c_routing)
        graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        fns = {
            "eager": lambda: eager._decode(
                token, e_real, col, e_bias[:, None, None, : col + 1], e_routing[:, :, col]
            ),
            "static-grouped": lambda: decode_static(
                static_grouped, token, g_real, col_t, g_bias, g_routing
            ),
            "static": lambda: decode_static(static, token, s_real, col_t, s_bias, s_routing),
            "compiled": lambda: step(token, c_real, col_t, c_bias, c_routing),
        }
        rounds = run_rounds(fns, rounds=repeats, warmup=3)
    return {
        "shape": name,
        "rows": rows,
        "table": rounds.rows(baseline="eager"),
        "rounds": rounds.record(baseline="eager"),
        "load": rounds.load_line(),
        "compile_s": compile_s,
        "graphs_over_a_rollout": graphs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the tiny shape, few rounds")
    args = parser.parse_args(argv)
    set_threads(1)
    shapes = {"tiny-moe": SHAPES["tiny-moe"]} if args.quick else SHAPES
    repeats = 10 if args.quick else 30
    results = [bench_shape(name, model, rows, repeats) for name, (model, rows) in shapes.items()]
    for r in results:
        print(
            f"{r['shape']} ({r['rows']} rows): compile {r['compile_s']:.1f} s, "
            f"{r['graphs_over_a_rollout']} graph(s) over a rollout; {r['load']}"
        )
        print_table(r["table"], ["variant", "wall_ms", "cpu_ms", "x_wall", "x_cpu"])
    write_results("decode_compile", {"results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
