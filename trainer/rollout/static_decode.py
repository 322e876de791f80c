"""A decode step of fixed shapes, for ``torch.compile`` and CUDA graphs.

The engine's ``EngineForward.decode`` (trainer/rollout/forward.py) reads the KV cache up to
column ``col`` and writes the new key and value at a Python-int column: the
slice grows by one column per token, so a compiled step would recompile and a
captured CUDA graph (which replays fixed shapes and fixed addresses) could not
run it at all. ``decode_static`` computes the same step over a fixed WIDTH W of
the cache, a bucket (``decode_buckets``: powers of two from ``BUCKET_MIN``, the
last one the whole cache), one graph per bucket: attention spans at most twice
the columns in use instead of the whole cache (on the H200 a step over the
whole width of a batch-1,024 rollout took 47.5 ms against 12.7 ms eager).
Within a bucket:

* the new key / value (and the routing) go in with ``index_copy_`` at a (1,)
  column tensor, so the column is data, not a Python constant;
* attention reads the W columns; columns after ``col`` get -inf in the bias,
  so their softmax weight is exactly 0 (exp(-inf) = 0) and they add exactly 0
  to the weighted sum of values, provided the cache holds finite numbers
  there (0 x NaN is NaN): ``zero_cache`` fills it once per rollout;
* sliding windows mask in-graph (columns <= col - window), as ``decode``
  masks by slicing.

The layers are the engine's own decode loop (``EngineForward.decode_layers``);
only the cache access differs. A GEMM over more columns may block its sums
differently, so logits agree to float rounding, not bit for
bit (tests/trainer/test_static_decode.py bounds it). Compiled-vs-eager timings
on the CPU: bench/bench_decode_compile.py, docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from trainer.rollout.engine import RolloutEngine

DecodeStep = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor
]


# The narrowest bucket: a cache width below it saves nothing worth a graph.
BUCKET_MIN = 64


def decode_buckets(total: int, minimum: int | None = None) -> list[int]:
    """The cache widths a rollout of ``total`` columns decodes over: powers of two
    from ``minimum`` (default ``BUCKET_MIN``) below ``total``, then ``total`` (each at
    most twice the columns a step in it reads, one compiled graph each:
    log2(total / minimum) + 1)."""
    widths, width = [], minimum or BUCKET_MIN
    while width < total:
        widths.append(width)
        width *= 2
    return [*widths, total]


def bucket_for(columns: int, buckets: list[int]) -> int:
    """The narrowest bucket holding ``columns`` cache columns (col + 1)."""
    return next(w for w in buckets if w >= columns)


def zero_cache(engine: RolloutEngine) -> None:
    """Make every cache column finite (zeros) before a static-width decode reads it."""
    keys, values = engine.forward_pass.cache
    for t in keys if engine.cfg.mla.enabled else (*keys, *values):  # latent values: views
        t.zero_()


def decode_static(
    engine: RolloutEngine,
    token: torch.Tensor,
    position: torch.Tensor,
    col: torch.Tensor,
    key_bias: torch.Tensor,
    routing_out: torch.Tensor | None,
    width: int | None = None,
) -> torch.Tensor:
    """One cached decode step over the first ``width`` cache columns (None: the whole
    cache); returns fp32 logits (B, V).

    token, position: (B,) the token fed at cache column ``col`` and its position
    id; col: (1,) long, the cache column (< width); key_bias: (B, S) fp32, 0 where
    a key column holds a real token and -inf on pads
    (``RolloutEngine._decode_state``; columns after ``col`` are masked here);
    routing_out: (L_moe, B, S, k) buffer for the natural top-k (column ``col``
    written), or None.
    """
    logits, tops = decode_static_tops(
        engine, token, position, col, key_bias, routing_out is not None, width
    )
    if routing_out is not None:
        routing_out.index_copy_(2, col, tops[:, :, None].to(routing_out.dtype))
    return logits


def decode_static_tops(
    engine: RolloutEngine,
    token: torch.Tensor,
    position: torch.Tensor,
    col: torch.Tensor,
    key_bias: torch.Tensor,
    routing: bool,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``decode_static``'s step, returning the natural top-k of every MoE layer
    (L_moe, B, k) instead of writing them (None when ``routing`` is off): the
    compiled step writes them into the routing buffer outside its graph, so that
    the graph mutates no input but the per-layer KV tensors."""
    keys, values = engine.forward_pass.cache  # per layer: (B, Hkv, S, hd)
    width = keys[0].shape[2] if width is None else width
    columns = torch.arange(width, device=token.device)
    bias = key_bias[:, :width].masked_fill(columns > col, float("-inf"))[:, None, None, :]
    slide_bias = None
    window = engine.cfg.sliding_window
    if window is not None:
        # transformers' sliding window: a query at column q sees columns > q - window
        slide_bias = bias.masked_fill(columns <= col - window, float("-inf"))
    latent = engine.cfg.mla.enabled

    def kv(i: int, k: torch.Tensor, v: torch.Tensor):
        # in place into the layer's whole tensor (a graph input inductor keeps in place)
        keys[i].index_copy_(2, col, k[:, :, None].to(keys[i].dtype))
        if not latent:  # a latent layer's values are a view of its keys: written with them
            values[i].index_copy_(2, col, v[:, :, None].to(values[i].dtype))
        attend = slide_bias if engine.cfg.uses_sliding_window(i) else bias
        return keys[i][:, :, :width], values[i][:, :, :width], attend

    tops: list[torch.Tensor] = []
    logits = engine.forward_pass.decode_layers(
        token, position, kv, (lambda _, top: tops.append(top)) if routing else None
    )
    return logits, torch.stack(tops) if tops else None


# rollout.decode=auto compiles the step on CUDA when a run decodes at least this many
# steps (run.steps x rollout.max_new_tokens): on the H200 the first call of a
# compiled step took 13-34 s (compile and capture, per graph, per process) and a
# captured step saved 6.6 ms at batch 64 (4.42 ms against 11.0 ms eager), so a
# graph pays for itself after about 5,000 steps; with 2-3 buckets, about 10,000.
AUTO_COMPILED_MIN_STEPS = 10_000


def choose_decode(
    requested: str,
    device_type: str,
    decode_steps: int,
    precision: str,
    kv_cache: bool,
    expert_parallel: int = 1,
) -> tuple[str, str]:
    """``rollout.decode`` resolved: (``eager`` or ``compiled``, why). ``auto`` compiles
    on CUDA for a run of at least ``AUTO_COMPILED_MIN_STEPS`` decode steps where the
    compiled step can run (a KV cache, no fp8, no expert parallelism); eager on the
    CPU, where inductor's step measured 2.2-3.0x slower than eager."""
    if requested != "auto":
        return requested, "asked for"
    if device_type != "cuda":
        return "eager", "auto: eager off CUDA (the compiled step is slower on the CPU)"
    if not kv_cache or precision == "fp8" or expert_parallel > 1:
        return "eager", "auto: the compiled step cannot run this rollout"
    if decode_steps < AUTO_COMPILED_MIN_STEPS:
        return "eager", (
            f"auto: {decode_steps} decode steps do not pay for compiling "
            f"(< {AUTO_COMPILED_MIN_STEPS})"
        )
    return "compiled", f"auto: {decode_steps} decode steps on CUDA"


def compiled_moe_backend(requested: str, dtype: torch.dtype) -> str:
    """The expert backend of an engine that compiles its decode step: ``auto`` becomes
    ``padded`` where the engine stores anything but bf16, since torch._grouped_mm
    traces (its meta kernel) for bf16 operands only."""
    return "padded" if requested == "auto" and dtype != torch.bfloat16 else requested


def compiled_decode(engine: RolloutEngine, mode: str | None = None) -> DecodeStep:
    """``decode_static`` of this engine under ``torch.compile`` (fixed shapes:
    ``dynamic=False``). ``mode="reduce-overhead"`` on CUDA captures the step as a
    CUDA graph; on the CPU the default mode fuses the elementwise ops (inductor's
    C++ backend).

    torch._grouped_mm traces (its meta kernel) for bf16 operands only, so an engine
    that stores fp32 (every CPU engine: half precisions are emulated there) must
    run its experts on the ``padded`` backend (batched GEMMs) to compile.
    """
    if engine.cfg.is_moe and engine.num.dtype != torch.bfloat16 and engine.moe_backend != "padded":
        raise ValueError(
            f"compiled decode of a {engine.num.dtype} engine needs moe_backend='padded' "
            f"(not {engine.moe_backend!r}): torch._grouped_mm compiles for bf16 operands only"
        )

    def static_step(token, position, col, key_bias, routing, width):
        return decode_static_tops(engine, token, position, col, key_bias, routing, width)

    # One graph per (batch size, bucket): more than dynamo's default 8 recompiles of
    # one function when a run decodes at a few batch sizes over up to 8 buckets.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    compiled = torch.compile(static_step, dynamic=False, mode=mode)
    marked: set[int] = set()  # ids of the buffers already marked (cache, routing, rope)

    def step(token, position, col, key_bias, routing_out, width=None):
        # The dispatch's slot index buffer is engine state the step would otherwise
        # create inside the graph on its first call (a second graph on the next):
        # made here, outside it, once per batch size.
        rows = token.shape[0] * engine.cfg.top_k
        fwd, moe = engine.forward_pass, engine.forward_pass.moe
        if engine.cfg.is_moe and (moe.slots is None or moe.slots.numel() < rows):
            moe.slots = torch.arange(rows, device=token.device)
        buffers = (*fwd.cache[0], *fwd.cache[1], routing_out, fwd.rope, moe.slots)
        if {id(b) for b in buffers} - marked:  # new buffers: a new batch size or length
            mark_static([*engine_tensors(engine), routing_out])
            marked.update(id(b) for b in buffers)
        logits, tops = compiled(token, position, col, key_bias, routing_out is not None, width)
        if routing_out is not None:  # one small write, outside the graph
            routing_out.index_copy_(2, col, tops[:, :, None].to(routing_out.dtype))
        return logits

    return step


def mark_static(tensors: Iterable[torch.Tensor | None]) -> None:
    """Tell ``torch.compile`` that these tensors keep their address from call to call.

    Under ``mode="reduce-overhead"`` inductor's CUDA-graph trees let a graph
    write in place only into such static inputs; the decode step writes the KV
    cache and the routing buffer, and with them unmarked inductor skipped the
    graph ("skipping cudagraphs due to mutated inputs", seen on an H200,
    docs/gpu.md). Static inputs are also not copied into the graph's memory
    pool before each replay, which matters for the weights. transformers'
    StaticCache marks its cache the same way. ``guard=False``: no recompile
    when an address changes (a new batch size brings new shapes anyway), the
    graph is recorded again. No effect without CUDA graphs.
    """
    for t in tensors:
        if t is not None and getattr(t, "_dynamo_static_input_type", None) is None:
            torch._dynamo.mark_static_address(t, guard=False)


def engine_tensors(engine: RolloutEngine) -> Iterator[torch.Tensor]:
    """Every tensor held by the engine and its parts (weights in whatever container
    its precision stores them, embeddings, the head, rope frequencies, the cache),
    found by walking its attributes and those of the trainer's own objects it holds."""
    seen: set[int] = set()

    def walk(value: object, depth: int) -> Iterator[torch.Tensor]:
        if isinstance(value, torch.Tensor):
            if id(value) not in seen:
                seen.add(id(value))
                yield value
        elif depth == 0:
            return
        elif isinstance(value, list | tuple):
            for item in value:
                yield from walk(item, depth - 1)
        elif type(value).__module__.startswith("trainer.") and hasattr(value, "__dict__"):
            for item in vars(value).values():
                yield from walk(item, depth - 1)

    yield from walk(engine, 6)
