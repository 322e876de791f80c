"""The fixed-shape decode step (trainer.rollout.static_decode) against the engine's
own ``_decode``: same logits to float rounding, same routing, same cache, no host
sync; and under torch.compile (slow: inductor's C++ build)."""

from __future__ import annotations

import pytest
import torch

from trainer.config.presets import resolve_preset
from trainer.devices.sync_count import count_syncs
from trainer.model import TransformerLM
from trainer.rollout import static_decode
from trainer.rollout.engine import RolloutEngine
from trainer.rollout.static_decode import (
    bucket_for,
    compiled_decode,
    decode_buckets,
    decode_static,
    zero_cache,
)

VOCAB = 32
B, P, NEW = 4, 6, 5


def _engines(precision: str, backend: str = "auto", **model):
    base = resolve_preset("moe-grpo").model
    cfg = type(base).model_validate({**base.model_dump(), **model})
    torch.manual_seed(0)
    policy = TransformerLM(cfg, VOCAB)
    engines = []
    for _ in range(2):
        engine = RolloutEngine(cfg, VOCAB, precision=precision, moe_backend=backend)
        engine.load_weights(policy.state_dict())
        engines.append(engine)
    return engines


def _prefill(engine, prompts, mask):
    total = P + NEW
    engine.forward_pass.static_cache(B, total)
    if engine.weights.pos_emb is None:
        engine.forward_pass.rope_table(total)
    zero_cache(engine)
    routing = engine._routing_buffer(B, total)
    engine.forward_pass.forward(
        prompts, mask.long().cumsum(-1).sub(1).clamp(min=0), mask, 0, routing[:, :, :P]
    )
    n_real, key_bias = engine._decode_state(mask, total)
    return routing, n_real, key_bias


def _decode_both(precision: str, step_fn=None, backend: str = "auto", buckets=None, **model):
    dynamic, static = _engines(precision, backend, **model)
    prompts = torch.randint(3, VOCAB, (B, P), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompts, dtype=torch.bool)
    mask[0, :2] = False  # a left-padded row
    out = []
    with torch.inference_mode():
        r_dyn, n_dyn, bias_dyn = _prefill(dynamic, prompts, mask)
        r_sta, n_sta, bias_sta = _prefill(static, prompts, mask)
        feed = torch.randint(3, VOCAB, (NEW, B), generator=torch.Generator().manual_seed(2))
        for step in range(NEW - 1):
            col = P + step
            a = dynamic.forward_pass.decode(
                feed[step], n_dyn, col, bias_dyn[:, None, None, : col + 1], r_dyn[:, :, col]
            )
            col_t = torch.tensor([col])
            width = None if buckets is None else bucket_for(col + 1, buckets)
            if step_fn is None:
                b = decode_static(static, feed[step], n_sta, col_t, bias_sta, r_sta, width)
            else:
                b = step_fn(static)(feed[step], n_sta, col_t, bias_sta, r_sta, width)
            n_dyn += 1
            n_sta += 1
            out.append((a.clone(), b.clone()))
        end = P + NEW - 1
        caches = tuple(
            torch.stack(e.forward_pass.cache[0])[..., :end, :] for e in (dynamic, static)
        )
    return out, (r_dyn[:, :, :end], r_sta[:, :, :end]), caches


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_static_step_equals_the_engines_decode(precision):
    steps, routing, caches = _decode_both(precision)
    for a, b in steps:
        # Same formulas and rounding; only the attention GEMM's blocking over more
        # (zero-weight) columns may reorder a sum: a few fp32 ulps of the logits.
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert torch.equal(routing[0], routing[1])  # the same experts chosen
    torch.testing.assert_close(caches[1], caches[0], rtol=0, atol=1e-6)


def test_buckets_are_powers_of_two_then_the_whole_cache():
    assert decode_buckets(128) == [64, 128]
    assert decode_buckets(48) == [48]
    assert decode_buckets(300) == [64, 128, 256, 300]
    assert decode_buckets(11, minimum=4) == [4, 8, 11]
    assert [bucket_for(c, [4, 8, 11]) for c in (1, 4, 5, 9, 11)] == [4, 4, 8, 11, 11]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_step_over_a_bucket_of_the_cache_equals_the_engines_decode(precision):
    """Attention over the narrowest bucket (4, 8 or the whole 11 columns) holding the
    columns in use: the same step as the engine's own, to float rounding."""
    steps, routing, caches = _decode_both(precision, buckets=decode_buckets(P + NEW, 4))
    for a, b in steps:
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert torch.equal(routing[0], routing[1])
    torch.testing.assert_close(caches[1], caches[0], rtol=0, atol=1e-6)


def test_static_step_with_a_sliding_window():
    steps, routing, _ = _decode_both("fp32", buckets=[8, P + NEW], sliding_window=4)
    for a, b in steps:
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert torch.equal(routing[0], routing[1])


FEATURES = {
    "latent attention, sigmoid groups": {
        "mla": {"enabled": True, "q_lora_rank": 16, "kv_lora_rank": 24},
        "router": {"score": "sigmoid", "n_groups": 4, "topk_groups": 2, "scaling": 2.5},
        "shared_expert_hidden": 32,
    },
    "sinks, biases, clamp, sliding": {
        "attention_sinks": True, "attention_bias": "qkvo", "sliding_window": 4,
        "sliding_layers": [0], "router": {"bias": True},
        "expert_ffn": {"bias": True, "activation": "clamped_swiglu", "limit": 1.0},
    },
    "partial rotary": {"rotary_fraction": 0.5, "qk_norm": "head", "n_kv_heads": 2},
}  # fmt: skip


@pytest.mark.parametrize("features", sorted(FEATURES))
def test_static_step_with_the_routed_families_features(features):
    """The latent cache (its values a view of the rows), sinks, partial rotary and the
    routers of DeepSeek/GLM/GPT-OSS decode the same over the whole cache width."""
    steps, routing, caches = _decode_both("fp32", **FEATURES[features])
    for a, b in steps:
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert torch.equal(routing[0], routing[1])
    torch.testing.assert_close(caches[1], caches[0], rtol=0, atol=1e-6)


def test_static_step_makes_no_host_sync():
    _, static = _engines("fp32")
    prompts = torch.randint(3, VOCAB, (B, P))
    mask = torch.ones_like(prompts, dtype=torch.bool)
    with torch.inference_mode():
        routing, n_real, key_bias = _prefill(static, prompts, mask)
        with count_syncs() as syncs:
            decode_static(static, prompts[:, -1], n_real, torch.tensor([P]), key_bias, routing)
    assert syncs.total == 0, syncs.report()


def test_compiling_an_fp32_engine_on_grouped_mm_is_refused():
    engine, _ = _engines("fp32")
    with pytest.raises(ValueError, match="padded"):
        compiled_decode(engine)


@pytest.mark.slow
@pytest.mark.parametrize("buckets", [None, [8, P + NEW]])
def test_compiled_static_step_equals_eager(buckets):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = {}

    def step_fn(engine):  # one compiled step for the whole rollout, as generate would hold it
        return compiled.setdefault("step", compiled_decode(engine))

    steps, routing, _ = _decode_both("fp32", step_fn=step_fn, backend="padded", buckets=buckets)
    for a, b in steps:
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)  # inductor fuses and reorders
    assert torch.equal(routing[0], routing[1])
    # every column of a bucket ran its one graph: the column is data, not a constant
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == len(buckets or [None])


@pytest.mark.slow
def test_the_compiled_step_writes_the_kv_cache_in_place():
    """inductor turns an in-place write into a view of a graph input into a copy of
    the whole input and a copy back; the per-layer cache tensors keep the write in
    place. No loop of the generated code spans a whole layer's cache (here
    B x Hkv x S x hd = 4 x 4 x 37 x 32 = 18,944 elements, a size nothing else has)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    engine, _ = _engines("fp32", "padded")
    total = 37
    engine.forward_pass.static_cache(B, total)
    engine.forward_pass.rope_table(total)
    zero_cache(engine)
    mask = torch.ones((B, P), dtype=torch.bool)
    n_real, key_bias = engine._decode_state(mask, total)
    routing = engine._routing_buffer(B, total)
    layer = engine.forward_pass.cache[0][0].numel()
    assert layer == 18944
    step = compiled_decode(engine)
    with torch.inference_mode():
        _, code = run_and_get_code(
            step, torch.ones(B, dtype=torch.long), n_real, torch.tensor([P]), key_bias, routing, 16
        )
    assert code and all(f"{layer}L" not in c and f"{layer}," not in c for c in code)


def test_compiled_decode_is_refused_where_it_cannot_run():
    from trainer.errors import FieldError
    from trainer.validation import validate_config

    for extra, why in (
        ({"kv_cache": False}, "kv_cache"),
        ({"precision": "fp8"}, "fp8"),
    ):
        with pytest.raises(FieldError, match=f"rollout.decode.*{why}"):
            validate_config({"rollout": {"decode": "compiled", **extra}})
    with pytest.raises(ValueError, match="decode"):
        RolloutEngine(resolve_preset("moe-grpo").model, VOCAB, decode="graphs")


def test_a_compiled_engine_stores_fp32_experts_on_the_padded_backend_and_says_so():
    from trainer.run.device_record import device_record

    cfg = resolve_preset("moe-grpo").model
    assert RolloutEngine(cfg, VOCAB, precision="fp32", decode="compiled").moe_backend == "padded"
    assert RolloutEngine(cfg, VOCAB, precision="fp32").moe_backend == "auto"
    run = resolve_preset("moe-grpo").model_copy(
        update={
            "rollout": resolve_preset("moe-grpo").rollout.model_copy(update={"decode": "compiled"})
        }
    )
    record = device_record(run, torch.device("cpu"), torch.float32)
    assert record["decode"] == "compiled" and record["moe_backend"]["rollout"] == "padded"


@pytest.mark.slow
def test_a_compiled_rollout_samples_what_the_eager_one_does():
    """Greedy generate through the compiled step (one graph for the whole rollout)
    gives the eager engine's tokens and routing, log-probs to float rounding."""
    cfg = resolve_preset("moe-grpo").model
    torch.manual_seed(0)
    policy = TransformerLM(cfg, VOCAB)
    eager = RolloutEngine(cfg, VOCAB, precision="fp32", moe_backend="padded")
    compiled = RolloutEngine(cfg, VOCAB, precision="fp32", decode="compiled")
    for engine in (eager, compiled):
        engine.load_weights(policy.state_dict())
    prompts = torch.randint(3, VOCAB, (B, P), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(prompts, dtype=torch.bool)
    mask[1, :3] = False
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    a = eager.generate(prompts, mask, max_new_tokens=NEW, temperature=0.0, eos_id=None)
    b = compiled.generate(prompts, mask, max_new_tokens=NEW, temperature=0.0, eos_id=None)
    c = compiled.generate(prompts, mask, max_new_tokens=NEW, temperature=0.0, eos_id=None)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(b.tokens, c.tokens)
    # the same expert sets (a near tie may list the two in the other order)
    assert torch.equal(a.routing.indices.sort(-1).values, b.routing.indices.sort(-1).values)
    torch.testing.assert_close(b.logprobs, a.logprobs, rtol=1e-4, atol=1e-4)
    # the rollout's columns (11) fit one bucket (64): one graph, reused across calls
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    # rows that stop at an EOS: the stopped columns masked out of later queries
    eos = int(a.tokens[0, P + 1])
    a = eager.generate(prompts, mask, max_new_tokens=NEW, temperature=0.0, eos_id=eos)
    b = compiled.generate(prompts, mask, max_new_tokens=NEW, temperature=0.0, eos_id=eos)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.attention_mask, b.attention_mask)
    torch.testing.assert_close(b.logprobs, a.logprobs, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_compiled_rollout_over_several_buckets_samples_what_the_eager_one_does(monkeypatch):
    """Buckets of 4 and 8 columns and the whole 11: three graphs, the eager tokens."""
    monkeypatch.setattr(static_decode, "BUCKET_MIN", 4)
    cfg = resolve_preset("moe-grpo").model
    torch.manual_seed(0)
    policy = TransformerLM(cfg, VOCAB)
    eager = RolloutEngine(cfg, VOCAB, precision="fp32", moe_backend="padded")
    compiled = RolloutEngine(cfg, VOCAB, precision="fp32", decode="compiled")
    for engine in (eager, compiled):
        engine.load_weights(policy.state_dict())
    prompts = torch.randint(3, VOCAB, (B, 3), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(prompts, dtype=torch.bool)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    a = eager.generate(prompts, mask, max_new_tokens=8, temperature=0.0, eos_id=None)
    b = compiled.generate(prompts, mask, max_new_tokens=8, temperature=0.0, eos_id=None)
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.routing.indices.sort(-1).values, b.routing.indices.sort(-1).values)
    torch.testing.assert_close(b.logprobs, a.logprobs, rtol=1e-4, atol=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 3


def test_a_compiled_step_marks_the_engines_tensors_static(monkeypatch):
    """CUDA-graph trees let a graph write only into static inputs and copy every
    other input into the graph's pool before each replay: the step marks the
    weights, the KV cache and the kept routing buffer (torch.compile stood in by
    the plain function: the marking happens outside the graph)."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    cfg = resolve_preset("moe-grpo").model
    torch.manual_seed(0)
    engine = RolloutEngine(cfg, VOCAB, precision="fp32", decode="compiled")
    engine.load_weights(TransformerLM(cfg, VOCAB).state_dict())
    prompts = torch.randint(3, VOCAB, (B, P), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompts, dtype=torch.bool)
    first = engine.generate(prompts, mask, max_new_tokens=NEW, eos_id=None)
    kept = engine._kept_routing
    weights = [
        engine.weights.tok_emb,
        engine.weights.lm_head,
        engine.layers[0].attn_norm,
        engine.layers[0].router,
    ]
    for t in (
        *weights,
        *engine.forward_pass.cache[0],
        *engine.forward_pass.cache[1],
        kept,
        engine.forward_pass.rope,
        engine.forward_pass.moe.slots,
    ):
        assert getattr(t, "_dynamo_static_input_type", None) == "unguarded"
    second = engine.generate(prompts, mask, max_new_tokens=NEW, eos_id=None)
    assert engine._kept_routing is kept  # one buffer, one address, rollout after rollout
    # each rollout returns its own copy of the routing, not the kept buffer
    assert first.routing.indices.data_ptr() != second.routing.indices.data_ptr() != kept.data_ptr()


def test_auto_decode_compiles_on_cuda_only_where_a_run_pays_for_it():
    from trainer.rollout.static_decode import AUTO_COMPILED_MIN_STEPS, choose_decode

    long_run = AUTO_COMPILED_MIN_STEPS
    assert choose_decode("auto", "cuda", long_run, "bf16", True)[0] == "compiled"
    assert choose_decode("auto", "cuda", long_run - 1, "bf16", True)[0] == "eager"
    assert choose_decode("auto", "cpu", 10 * long_run, "bf16", True)[0] == "eager"
    assert choose_decode("auto", "cuda", long_run, "fp8", True)[0] == "eager"
    assert choose_decode("auto", "cuda", long_run, "bf16", False)[0] == "eager"
    assert choose_decode("auto", "cuda", long_run, "bf16", True, expert_parallel=2)[0] == "eager"
    assert choose_decode("compiled", "cpu", 1, "fp32", True) == ("compiled", "asked for")
    from trainer.run.device_record import device_record

    cfg = resolve_preset("moe-grpo")
    record = device_record(cfg, torch.device("cpu"), torch.float32)
    assert record["decode"] == "eager" and "off CUDA" in record["decode_reason"]
