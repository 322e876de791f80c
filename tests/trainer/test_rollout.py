"""Rollout engine: agreement with the training model, precision, sampling, packing."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ModelConfig
from trainer.model import TransformerLM
from trainer.rollout import (
    PackedRouting,
    RolloutEngine,
    index_dtype,
    prompt_logprobs,
    sample_next,
    top_p_filter,
)
from trainer.rollout.routing_pack import pack_routing, unpack_routing

VOCAB = 24


def model_and_engine(cfg: ModelConfig, precision: str = "fp32", seed: int = 0):
    torch.manual_seed(seed)
    model = TransformerLM(cfg, vocab_size=VOCAB).eval()
    engine = RolloutEngine(cfg, VOCAB, precision=precision)
    engine.load_weights(model.state_dict())
    return model, engine


def training_view(model: TransformerLM, tokens, mask, temperature: float = 1.0):
    with torch.no_grad():
        out = model(tokens, attention_mask=mask, return_routing=True)
    return prompt_logprobs(out.logits, tokens, mask, temperature), out.routing


def same_expert_set(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.sort(-1).values == b.sort(-1).values).all(-1)


@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_fp32_generate_logprobs_and_routing_match_training_forward(
    tiny_moe_cfg, make_batch, positional
):
    cfg = tiny_moe_cfg.model_copy(update={"positional": positional})
    model, engine = model_and_engine(cfg)
    prompt, mask = make_batch(VOCAB, [3, 6, 5, 1], 6)
    batch = engine.generate(
        prompt, mask, max_new_tokens=10, generator=torch.Generator().manual_seed(0), pad_id=0
    )
    assert batch.tokens.shape == (4, 16) and batch.prompt_len == 6
    train_lp, train_routing = training_view(model, batch.tokens, batch.attention_mask)
    real = batch.attention_mask
    torch.testing.assert_close(batch.logprobs[real], train_lp[real], rtol=0, atol=1e-4)
    assert (batch.logprobs[~real] == 0).all()
    fed = batch.routing.routing_mask
    for engine_idx, train in zip(batch.routing.unpack(), train_routing, strict=True):
        assert same_expert_set(engine_idx, train.natural_indices)[fed].all()


def test_score_matches_training_forward_with_temperature(tiny_moe_cfg, make_batch):
    model, engine = model_and_engine(tiny_moe_cfg)
    tokens, mask = make_batch(VOCAB, [7, 4, 2], 7, seed=3)
    engine_lp, routing = engine.score(tokens, mask, temperature=0.7)
    train_lp, _ = training_view(model, tokens, mask, temperature=0.7)
    torch.testing.assert_close(engine_lp, train_lp, rtol=0, atol=1e-4)
    assert routing.routing_mask.equal(mask)


def test_dense_model_engine_has_no_routing(tiny_dense_cfg, make_batch):
    model, engine = model_and_engine(tiny_dense_cfg)
    prompt, mask = make_batch(VOCAB, [2, 4], 4)
    batch = engine.generate(prompt, mask, max_new_tokens=5, generator=torch.Generator())
    assert batch.routing is None and batch.routing_mask is None
    train_lp, _ = training_view(model, batch.tokens, batch.attention_mask)
    real = batch.attention_mask
    torch.testing.assert_close(batch.logprobs[real], train_lp[real], rtol=0, atol=1e-4)


def test_kv_cache_and_full_recompute_agree(tiny_moe_cfg, make_batch):
    _, engine = model_and_engine(tiny_moe_cfg, precision="bf16")
    prompt, mask = make_batch(VOCAB, [3, 5], 5)
    runs = [
        engine.generate(
            prompt, mask, 8, generator=torch.Generator().manual_seed(4), use_kv_cache=cache
        )
        for cache in (True, False)
    ]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    torch.testing.assert_close(runs[0].logprobs, runs[1].logprobs, rtol=0, atol=1e-5)
    assert torch.equal(runs[0].routing.indices, runs[1].routing.indices)


def test_bf16_emulation_flips_a_small_share_of_routing(make_batch):
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=4, n_experts=8, top_k=2, expert_hidden=64)
    torch.manual_seed(0)
    model = TransformerLM(cfg, vocab_size=VOCAB).eval()
    tokens, mask = make_batch(VOCAB, [48] * 16, 48, seed=1)
    routings = {}
    for precision in ("fp32", "bf16"):
        engine = RolloutEngine(cfg, VOCAB, precision=precision)
        engine.load_weights(model.state_dict())
        _, routings[precision] = engine.score(tokens, mask)
    flips = [
        1 - same_expert_set(a, b)[mask].float().mean().item()
        for a, b in zip(routings["fp32"].unpack(), routings["bf16"].unpack(), strict=True)
    ]
    # Measured with these seeds: about 1-4% per layer; the disagreement is small but real.
    assert all(0 < f < 0.15 for f in flips), flips


def test_emulated_bf16_rounds_weights_once_at_load(tiny_moe_cfg):
    model, engine = model_and_engine(tiny_moe_cfg, precision="bf16")
    w = engine.layers[0].wqkv
    assert w.dtype == torch.float32
    assert torch.equal(w, w.to(torch.bfloat16).float())
    assert not torch.equal(w, model.blocks[0].attn.qkv.weight.detach())


def test_load_weights_follows_training_updates(tiny_moe_cfg, make_batch):
    model, engine = model_and_engine(tiny_moe_cfg)
    tokens, mask = make_batch(VOCAB, [5, 5], 5)
    before, _ = engine.score(tokens, mask)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    engine.load_weights(model.state_dict())
    after, _ = engine.score(tokens, mask)
    train_lp, _ = training_view(model, tokens, mask)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, train_lp, rtol=0, atol=1e-4)


def test_sampling_is_deterministic_with_a_seeded_generator(tiny_moe_cfg, make_batch):
    _, engine = model_and_engine(tiny_moe_cfg, precision="bf16")
    prompt, mask = make_batch(VOCAB, [4, 2, 4], 4)

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return engine.generate(prompt, mask, 12, temperature=1.0, top_p=0.9, generator=g)

    a, b, c = run(7), run(7), run(8)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.tokens, c.tokens)


def test_eos_stops_rows_and_pads_after(tiny_moe_cfg, make_batch):
    _, engine = model_and_engine(tiny_moe_cfg, seed=5)
    prompt, mask = make_batch(VOCAB, [4, 3, 4, 2], 4, seed=2)
    greedy = engine.generate(prompt, mask, 10, temperature=0.0, pad_id=0)
    eos = int(greedy.tokens[0, 4 + 2])  # row 0's third response token
    batch = engine.generate(prompt, mask, 10, temperature=0.0, eos_id=eos, pad_id=0)
    for row in range(4):
        response = batch.tokens[row, 4:]
        hits = (greedy.tokens[row, 4:] == eos).nonzero()
        if len(hits) == 0:
            assert batch.response_mask[row, 4:].all()
            continue
        stop = int(hits[0])
        assert response[stop] == eos
        assert batch.response_mask[row, 4 : 4 + stop + 1].all()
        assert not batch.response_mask[row, 4 + stop + 1 :].any()
        assert not batch.attention_mask[row, 4 + stop + 1 :].any()
        assert (response[stop + 1 :] == 0).all()
        assert (batch.logprobs[row, 4 + stop + 1 :] == 0).all()
    assert batch.response_mask[0].sum() <= 3  # row 0 stopped at its first EOS


def test_any_of_several_stop_ids_ends_a_row(tiny_moe_cfg, make_batch):
    """eos_id as a list (generation_config.json's eos_token_id): a row ends at the
    first of them it samples; one id in a list is that id."""
    _, engine = model_and_engine(tiny_moe_cfg, seed=5)
    prompt, mask = make_batch(VOCAB, [4, 3, 4, 2], 4, seed=2)
    greedy = engine.generate(prompt, mask, 10, temperature=0.0, pad_id=0)
    first, second = int(greedy.tokens[0, 4 + 3]), int(greedy.tokens[1, 4 + 1])
    ids = [first, second]
    batch = engine.generate(prompt, mask, 10, temperature=0.0, eos_id=ids, pad_id=0)
    for row in range(4):
        hits = torch.isin(greedy.tokens[row, 4:], torch.tensor(ids)).nonzero()
        n = int(hits[0]) + 1 if len(hits) else 10
        assert int(batch.response_mask[row].sum()) == n, row
        assert torch.equal(batch.tokens[row, 4 : 4 + n], greedy.tokens[row, 4 : 4 + n])
    one = engine.generate(prompt, mask, 10, temperature=0.0, eos_id=[first], pad_id=0)
    same = engine.generate(prompt, mask, 10, temperature=0.0, eos_id=first, pad_id=0)
    assert torch.equal(one.tokens, same.tokens) and torch.equal(one.logprobs, same.logprobs)


def test_generation_ends_when_every_row_stopped(tiny_moe_cfg, make_batch):
    _, engine = model_and_engine(tiny_moe_cfg, seed=5)
    prompt, mask = make_batch(VOCAB, [3], 3, seed=2)
    greedy = engine.generate(prompt, mask, 10, temperature=0.0)
    eos = int(greedy.tokens[0, 3 + 1])
    batch = engine.generate(prompt, mask, 10, temperature=0.0, eos_id=eos)
    first = int((greedy.tokens[0, 3:] == eos).nonzero()[0])
    assert batch.tokens.shape[1] == 3 + first + 1


def test_routing_mask_excludes_pads_and_the_last_sampled_token(tiny_moe_cfg, make_batch):
    _, engine = model_and_engine(tiny_moe_cfg)
    prompt, mask = make_batch(VOCAB, [2, 4], 4)
    batch = engine.generate(prompt, mask, 5, generator=torch.Generator().manual_seed(0))
    fed = batch.routing_mask
    assert torch.equal(fed[:, :-1], batch.attention_mask[:, :-1])
    assert not fed[:, -1].any()


def test_top_p_filter_by_hand():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert torch.equal(top_p_filter(probs, 0.7), torch.tensor([[0.5, 0.3, 0.0, 0.0]]))
    assert torch.equal(top_p_filter(probs, 0.5), torch.tensor([[0.5, 0.0, 0.0, 0.0]]))
    assert torch.equal(top_p_filter(probs, 1.0), probs)


@pytest.mark.parametrize(
    "n_experts, dtype", [(8, torch.uint8), (256, torch.uint8), (300, torch.int16)]
)
def test_pack_unpack_round_trip_and_bytes(n_experts, dtype):
    gen = torch.Generator().manual_seed(0)
    layers = [torch.randint(0, n_experts, (3, 5, 2), generator=gen) for _ in range(4)]
    mask = torch.ones(3, 5, dtype=torch.bool)
    packed = PackedRouting.from_indices(layers, n_experts, mask)
    assert packed.indices.dtype == dtype == index_dtype(n_experts)
    assert packed.bytes_per_token_layer == 2 * dtype.itemsize
    for a, b in zip(packed.unpack(), layers, strict=True):
        assert a.dtype == torch.long and torch.equal(a, b)


@pytest.mark.parametrize("n_experts, bits", [(2, 1), (5, 3), (8, 3), (16, 4), (300, 9)])
def test_bitpack_round_trip(n_experts, bits):
    gen = torch.Generator().manual_seed(1)
    layers = [torch.randint(0, n_experts, (2, 7, 3), generator=gen) for _ in range(3)]
    packed = PackedRouting.from_indices(layers, n_experts, torch.ones(2, 7, dtype=torch.bool))
    # The transport packer (the one the RL loop ships the engine's routing with).
    bitpacked = pack_routing(list(packed.indices.unbind(0)), n_experts)
    assert bitpacked.bits == bits
    assert bitpacked.nbytes == -(-3 * 2 * 7 * 3 * bits // 8)  # whole bytes of the stream
    assert bitpacked.bytes_per_token_layer == bitpacked.nbytes / (3 * 2 * 7)
    for a, b in zip(unpack_routing(bitpacked), layers, strict=True):
        assert torch.equal(a, b)


def test_generate_records_routing_in_smallest_dtype(tiny_moe_cfg, make_batch):
    _, engine = model_and_engine(tiny_moe_cfg)
    prompt, mask = make_batch(VOCAB, [3, 3], 3)
    batch = engine.generate(prompt, mask, 4, generator=torch.Generator().manual_seed(0))
    assert batch.routing.indices.dtype == torch.uint8
    assert batch.routing.indices.shape == (2, 2, batch.tokens.shape[1], 2)
    assert batch.routing.bytes_per_token_layer == 2.0


def test_the_race_draws_what_multinomial_draws():
    # The exponential race is torch.multinomial's one-sample algorithm: with the
    # same seed both pick the same tokens and leave the generator in the same state.
    logp = torch.log_softmax(torch.randn(64, 24, generator=torch.Generator().manual_seed(0)), -1)
    ours, ref = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    tokens = sample_next(logp, 1.0, 1.0, ours, "race")
    assert torch.equal(tokens, torch.multinomial(logp.exp(), 1, generator=ref).squeeze(-1))
    assert torch.equal(ours.get_state(), ref.get_state())


def test_inverse_cdf_on_a_hand_case():
    """cdf (0.1, 0.3, 0.6, 1.0); torch's CPU generator seeded 0 draws u = 0.4963,
    0.7682, 0.0885, 0.1320: the first token whose cdf exceeds u is 2, 3, 0, 1. With
    top_p 0.5 the kept tokens are 3 (0.4) and 2 (0.3), sorted, total 0.7: u x 0.7 =
    0.347, 0.538, 0.062, 0.092 against cdf (0.4, 0.7) picks 3, 2, 3, 3."""
    logp = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).log().expand(4, 4)
    g = torch.Generator().manual_seed(0)
    assert sample_next(logp, 1.0, 1.0, g).tolist() == [2, 3, 0, 1]
    assert sample_next(logp, 1.0, 0.5, torch.Generator().manual_seed(0)).tolist() == [3, 2, 3, 3]
    # one uniform per row: the generator moved exactly as far as torch.rand(4, 1) takes it
    ref = torch.Generator().manual_seed(0)
    torch.rand((4, 1), generator=ref)
    assert torch.equal(g.get_state(), ref.get_state())


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_inverse_cdf_draws_the_race_distribution(top_p):
    """Both samplers draw from the same (top-p filtered) distribution: a chi-square
    goodness-of-fit test of 40,000 draws of each against the probabilities, at a
    significance of 0.001, over a vocabulary with zero-probability tokens (never drawn)."""
    from scipy.stats import chisquare

    probs = torch.tensor([0.30, 0.0, 0.22, 0.18, 0.12, 0.08, 0.06, 0.04, 0.0], dtype=torch.float64)
    expected = top_p_filter(probs[None], top_p)[0]
    expected = expected / expected.sum()
    logp = probs.float().log().expand(40000, -1)
    for sampler in ("inverse_cdf", "race"):
        tokens = sample_next(logp, 1.0, top_p, torch.Generator().manual_seed(3), sampler)
        counts = torch.bincount(tokens, minlength=probs.numel()).double()
        assert counts[expected == 0].sum() == 0, sampler
        kept = expected > 0
        result = chisquare(counts[kept].numpy(), (expected[kept] * tokens.numel()).numpy())
        assert result.pvalue > 1e-3, (sampler, result)


def test_inverse_cdf_never_draws_a_token_of_zero_probability_at_the_top_of_the_cdf():
    """u just below 1 times the total may round up to the total in fp32; the draw is
    clamped below it, so the last token of non-zero probability is drawn, never the
    zero-probability tail after it."""
    logp = torch.tensor([[0.5, 0.5, 0.0, 0.0]]).log().expand(4096, 4).contiguous()
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        assert int(sample_next(logp, 1.0, 1.0, g).max()) <= 1


def test_sample_next_frequencies_follow_the_probabilities():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).expand(20000, 4)
    tokens = sample_next(probs.log(), 1.0, 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    torch.testing.assert_close(freq, probs[0], rtol=0, atol=0.015)


def test_a_rollout_without_prompt_scores_samples_the_same_tokens(tiny_moe_cfg, make_batch):
    """The RL step asks for response log-probs only: the prefill's LM head then runs
    at the last prompt position; tokens, response log-probs and routing are the same."""
    _, engine = model_and_engine(tiny_moe_cfg)
    prompt, mask = make_batch(VOCAB, [3, 5, 4], 5)
    full = engine.generate(prompt, mask, 6, generator=torch.Generator().manual_seed(0))
    lean = engine.generate(
        prompt, mask, 6, generator=torch.Generator().manual_seed(0), score_prompt=False
    )
    assert torch.equal(full.tokens, lean.tokens)
    assert torch.equal(full.logprobs[:, 5:], lean.logprobs[:, 5:])
    assert torch.equal(full.routing.indices, lean.routing.indices)
    assert not lean.logprobs[:, :5].any()


@pytest.mark.parametrize("sampler", ["inverse_cdf", "race"])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_a_row_of_nan_logprobs_samples_a_token_in_range(sampler, top_p):
    """A policy whose logits overflowed gives NaN log-probs: the draw stays a token id
    (the NaN reaches the loss, where the run records it), never an index error."""
    logp = torch.log_softmax(torch.randn(3, 7), dim=-1)
    logp[1] = float("nan")
    tokens = sample_next(logp, 1.0, top_p, torch.Generator().manual_seed(0), sampler)
    assert tokens.shape == (3,) and int(tokens.min()) >= 0 and int(tokens.max()) < 7
