"""The routing-only dose: rollout.router_noise moves the engine's expert choice and nothing else."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ExperimentConfig
from trainer.model import TransformerLM
from trainer.rollout import RolloutEngine, prompt_logprobs
from trainer.rollout.router_noise import RouterNoise

VOCAB = 24


def engine_pair(cfg, sigma: float, kind: str = "fixed", seed: int = 0):
    torch.manual_seed(0)
    model = TransformerLM(cfg, vocab_size=VOCAB).eval()
    noise = RouterNoise(sigma, kind, cfg.n_moe_blocks, cfg.d_model, cfg.n_experts, seed=seed)
    engine = RolloutEngine(cfg, VOCAB, precision="fp32", router_noise=noise)
    engine.load_weights(model.state_dict())
    return model, engine


def test_fixed_perturbation_has_std_sigma_and_is_a_function_of_the_input():
    noise = RouterNoise(0.2, "fixed", n_moe_layers=3, d_model=256, n_experts=64, seed=5)
    x = torch.randn(2048, 256) * 3.0  # the scale of x does not matter (x / rms(x))
    zeros = torch.zeros(2048, 64)
    delta = noise.perturb(zeros, x, moe_layer=1)
    # Over the projection's draw, each entry is N(0, sigma^2): the empirical std of
    # 131,072 entries is within 2% of 0.2.
    assert abs(delta.std().item() - 0.2) < 0.004
    assert torch.equal(delta, noise.perturb(zeros, x, moe_layer=1))
    assert not torch.equal(delta, noise.perturb(zeros, x, moe_layer=2))
    # The same projections from the same seed (a rerun routes the same).
    again = RouterNoise(0.2, "fixed", n_moe_layers=3, d_model=256, n_experts=64, seed=5)
    assert torch.equal(delta, again.perturb(zeros, x, moe_layer=1))


def test_fresh_noise_differs_between_calls_and_replays_from_its_generator():
    gen = torch.Generator().manual_seed(3)
    noise = RouterNoise(0.5, "fresh", 1, 16, 8, seed=0, generator=gen)
    x, scores = torch.randn(100, 16), torch.zeros(100, 8)
    state = gen.get_state()
    first = noise.perturb(scores, x, 0)
    assert not torch.equal(first, noise.perturb(scores, x, 0))
    gen.set_state(state)
    assert torch.equal(first, noise.perturb(scores, x, 0))
    assert abs(first.std().item() - 0.5) < 0.05


def test_zero_sigma_engine_equals_the_plain_engine(tiny_moe_cfg, make_batch):
    model, noisy = engine_pair(tiny_moe_cfg, 0.0)
    plain = RolloutEngine(tiny_moe_cfg, VOCAB, precision="fp32")
    plain.load_weights(model.state_dict())
    assert noisy.router_noise is None
    tokens, mask = make_batch(VOCAB, [5, 7, 3], 7)
    lp_a, r_a = noisy.score(tokens, mask)
    lp_b, r_b = plain.score(tokens, mask)
    assert torch.equal(lp_a, lp_b) and torch.equal(r_a.indices, r_b.indices)


def test_only_the_choice_moves_when_every_expert_is_chosen(tiny_moe_cfg, make_batch):
    """With top_k == n_experts no choice can change, and the gates come from the
    unperturbed probabilities: the noisy engine's log-probs equal the training model's."""
    cfg = tiny_moe_cfg.model_copy(update={"top_k": tiny_moe_cfg.n_experts})
    model, engine = engine_pair(cfg, 2.0)
    tokens, mask = make_batch(VOCAB, [6, 4], 6)
    lp, _ = engine.score(tokens, mask)
    with torch.no_grad():
        train = prompt_logprobs(model(tokens, attention_mask=mask).logits, tokens, mask)
    torch.testing.assert_close(lp[mask], train[mask], rtol=0, atol=1e-5)


def test_noise_flips_routes_and_replaying_them_closes_the_gap(tiny_moe_cfg, make_batch):
    """The dose is routing only: the training model replaying the noisy engine's
    routes (R3) reproduces the engine's log-probs; without replay they differ."""
    model, engine = engine_pair(tiny_moe_cfg, 1.0)
    tokens, mask = make_batch(VOCAB, [8, 8, 6, 7], 8)
    engine_lp, routing = engine.score(tokens, mask)
    with torch.no_grad():
        natural = model(tokens, attention_mask=mask, return_routing=True)
        replayed = model(
            tokens,
            attention_mask=mask,
            routing_override=routing.unpack(),
            override_mask=[routing.routing_mask] * routing.indices.shape[0],
        )
    flipped = sum(
        (eng.sort(-1).values != tr.natural_indices.sort(-1).values).any(-1)[mask].sum().item()
        for eng, tr in zip(routing.unpack(), natural.routing, strict=True)
    )
    assert flipped > 0
    natural_lp = prompt_logprobs(natural.logits, tokens, mask)
    replayed_lp = prompt_logprobs(replayed.logits, tokens, mask)
    assert (natural_lp - engine_lp)[mask].abs().max() > 1e-3
    torch.testing.assert_close(replayed_lp[mask], engine_lp[mask], rtol=0, atol=1e-5)


def test_config_refuses_router_noise_on_a_dense_model():
    with pytest.raises(ValueError, match=r"rollout\.router_noise"):
        ExperimentConfig.model_validate(
            {"model": {"n_experts": 0}, "rollout": {"router_noise": 0.2}}
        )


def test_config_refuses_an_is_correction_on_a_rollout_ratio():
    with pytest.raises(ValueError, match="twice"):
        ExperimentConfig.model_validate(
            {
                "algorithm": {"behavior_logprobs": "rollout"},
                "stabilizers": {"is_correction": {"kind": "tis"}},
            }
        )
    ok = ExperimentConfig.model_validate(
        {
            "algorithm": {"behavior_logprobs": "train"},
            "stabilizers": {"is_correction": {"kind": "tis"}},
        }
    )
    assert ok.stabilizers.is_correction.kind == "tis"
