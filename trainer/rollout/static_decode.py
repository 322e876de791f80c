"""A decode step of fixed shapes, for ``torch.compile`` and CUDA graphs.

The engine's ``EngineForward.decode`` (trainer/rollout/forward.py) reads the KV cache up to
column ``col`` and writes the new key and value at a Python-int column: the
slice grows by one column per token, so a compiled step would recompile and a
captured CUDA graph (which replays fixed shapes and fixed addresses) could not
run it at all. ``decode_static`` computes the same step over the WHOLE cache
width S:

* the new key / value (and the routing) go in with ``index_copy_`` at a (1,)
  column tensor, so the column is data, not a Python constant;
* attention reads all S columns; columns after ``col`` get -inf in the bias,
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


def zero_cache(engine: RolloutEngine) -> None:
    """Make every cache column finite (zeros) before a static-width decode reads it."""
    keys, values = engine.forward_pass.cache
    keys.zero_()
    values.zero_()


def decode_static(
    engine: RolloutEngine,
    token: torch.Tensor,
    position: torch.Tensor,
    col: torch.Tensor,
    key_bias: torch.Tensor,
    routing_out: torch.Tensor | None,
) -> torch.Tensor:
    """One cached decode step over the whole cache width; returns fp32 logits (B, V).

    token, position: (B,) the token fed at cache column ``col`` and its position
    id; col: (1,) long, the cache column; key_bias: (B, S) fp32, 0 where a key
    column holds a real token and -inf on pads (``RolloutEngine._decode_state``;
    columns after ``col`` are masked here); routing_out: (L_moe, B, S, k) buffer
    for the natural top-k (column ``col`` written), or None.
    """
    keys, values = engine.forward_pass.cache  # (L, B, Hkv, S, hd)
    columns = torch.arange(keys.shape[3], device=token.device)
    bias = key_bias.masked_fill(columns > col, float("-inf"))[:, None, None, :]  # (B,1,1,S)
    slide_bias = None
    window = engine.cfg.sliding_window
    if window is not None:
        # transformers' sliding window: a query at column q sees columns > q - window
        slide_bias = bias.masked_fill(columns <= col - window, float("-inf"))

    def kv(i: int, k: torch.Tensor, v: torch.Tensor):
        keys[i].index_copy_(2, col, k[:, :, None].to(keys.dtype))
        values[i].index_copy_(2, col, v[:, :, None].to(values.dtype))
        return keys[i], values[i], slide_bias if engine.cfg.uses_sliding_window(i) else bias

    def store_routing(moe_i: int, top: torch.Tensor) -> None:
        routing_out[moe_i].index_copy_(1, col, top[:, None].to(routing_out.dtype))

    return engine.forward_pass.decode_layers(
        token, position, kv, None if routing_out is None else store_routing
    )


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

    def static_step(token, position, col, key_bias, routing_out):
        return decode_static(engine, token, position, col, key_bias, routing_out)

    compiled = torch.compile(static_step, dynamic=False, mode=mode)
    marked: set[int] = set()  # ids of the buffers already marked (cache, routing, rope)

    def step(token, position, col, key_bias, routing_out):
        # The dispatch's slot index buffer is engine state the step would otherwise
        # create inside the graph on its first call (a second graph on the next):
        # made here, outside it, once per batch size.
        rows = token.shape[0] * engine.cfg.top_k
        fwd, moe = engine.forward_pass, engine.forward_pass.moe
        if engine.cfg.is_moe and (moe.slots is None or moe.slots.numel() < rows):
            moe.slots = torch.arange(rows, device=token.device)
        buffers = (*fwd.cache, routing_out, fwd.rope, moe.slots)
        if {id(b) for b in buffers} - marked:  # new buffers: a new batch size or length
            mark_static([*engine_tensors(engine), routing_out])
            marked.update(id(b) for b in buffers)
        return compiled(token, position, col, key_bias, routing_out)

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
