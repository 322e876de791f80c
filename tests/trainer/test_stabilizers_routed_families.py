"""Replay, the aux-free bias and the router-noise dose on DeepSeek-style routers: sigmoid
scores, a live selection bias, group-limited top-k, routed scaling, a dense first block.

R3 and R2 must replay the group-limited selection exactly: the update forwards run the
recorded experts (even ones outside the groups the training router would keep) with
the gates of the TRAINING logits' affinities, the selection bias in the choice and
never in a gate (DeepSeek-V3, arXiv 2412.19437 eq. 13-16).
"""

from __future__ import annotations

import torch

from tests.trainer.conftest import left_padded_batch
from tests.trainer.test_stabilizers_loop import update_routings
from trainer import metric_keys as K
from trainer.algorithms.measure import routing_differs
from trainer.config import ExperimentConfig
from trainer.model import TransformerLM
from trainer.model.routing import affinities, gate_weights
from trainer.rollout import RolloutEngine
from trainer.rollout.data import RolloutData
from trainer.rollout.router_noise import RouterNoise
from trainer.run.measure_step import measure_batch
from trainer.run.update import PolicyUpdater
from trainer.stabilizers.loop import Stabilizers

VOCAB = 24
DEEPSEEK = {
    "n_layers": 3, "d_model": 64, "n_heads": 4, "n_experts": 8, "top_k": 2,
    "expert_hidden": 32, "max_seq_len": 64, "dense_layers": [0], "dense_hidden": 64,
    "shared_expert_hidden": 32, "mla": {"enabled": True, "q_lora_rank": 16},
    "router": {"score": "sigmoid", "n_groups": 4, "topk_groups": 2, "scaling": 2.5},
}  # fmt: skip


def _setup(**stabilizers):
    cfg = ExperimentConfig.model_validate(
        {
            "model": DEEPSEEK,
            "rollout": {"group_size": 4, "precision": "bf16"},
            "algorithm": {"minibatches": 4, "kl_coef": 0.0},
            "optim": {"lr": 1e-2},
            "stabilizers": {"balance": {"z_loss_coef": 1e-3}, **stabilizers},
        }
    )
    torch.manual_seed(0)
    policy = TransformerLM(cfg.model, VOCAB)
    with torch.no_grad():  # a live correction bias, as a DeepSeek-V3 checkpoint's
        for layer in policy.moe_layers:
            layer.router.selection_bias.normal_(0.0, 0.05)
    updater = PolicyUpdater(cfg, policy, None, torch.Generator().manual_seed(1))
    engine = RolloutEngine(cfg.model, VOCAB, precision="bf16")
    engine.load_weights(policy.state_dict())
    prompts, mask = left_padded_batch(VOCAB, [24, 20, 16, 12] * 4, 24, seed=1)
    rollout = engine.generate(prompts, mask, 8, generator=torch.Generator().manual_seed(2))
    rewards = (torch.arange(16) % 3 == 0).float()
    data = RolloutData.from_rollout(rollout, rewards, cfg.stabilizers.replay.compression)
    return cfg, policy, updater, data


def _assert_replayed(routing, recorded, real):
    """The recorded experts ran, weighted by the training logits' sigmoid affinities
    (no bias), renormalised and scaled by 2.5."""
    assert not routing_differs(routing.used_indices, recorded)[real].any()
    scores = affinities(routing.logits, "sigmoid")
    expected = gate_weights(scores, routing.used_indices, True, "sigmoid", 2.5)
    torch.testing.assert_close(routing.gates[real], expected[real])
    assert torch.allclose(routing.gates.sum(-1)[real], torch.tensor(2.5))


def test_r3_replays_the_engines_group_limited_experts_with_the_training_gates():
    cfg, policy, updater, data = _setup(replay={"mode": "r3"})
    metrics = updater.stabilizers.begin_step(0, data)
    metrics.update(measure_batch(cfg, policy, updater, data))
    assert metrics[K.MISMATCH_ROUTING_INCONSISTENCY] > 0  # the bf16 engine's real gap
    assert metrics[K.MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY] == 0.0
    assert set(metrics) >= {K.experts_load(1), K.experts_load(2)}  # the routed blocks
    assert K.experts_load(0) not in metrics  # the dense first block
    seen = data.routing_mask & data.attention_mask
    for rows, layers in update_routings(updater, data):
        for routing, recorded in zip(layers, data.rollout_routing, strict=True):
            _assert_replayed(routing, recorded[rows], seen[rows])


def test_r2_replays_the_old_policys_group_limited_experts():
    cfg, policy, updater, data = _setup(replay={"mode": "r2"})
    measure_batch(cfg, policy, updater, data)
    old = [idx.clone() for idx in data.old_routing]
    real = data.attention_mask
    for rows, layers in update_routings(updater, data):
        for routing, old_idx in zip(layers, old, strict=True):
            _assert_replayed(routing, old_idx[rows], real[rows])


def test_a_replayed_expert_outside_the_kept_groups_runs_as_recorded():
    """Group limits bind the router's own choice, not a replayed one: the two experts
    of each token's worst group (which the training router drops) run as recorded,
    weighted by their (unbiased) affinities."""
    _, policy, _, _ = _setup()
    tokens, mask = left_padded_batch(VOCAB, [12, 12], 12, seed=3)
    with torch.no_grad():
        natural = policy(tokens, mask, return_routing=True).routing
    overrides = []
    for r, layer in zip(natural, policy.moe_layers, strict=True):
        choice = r.logits.sigmoid() + layer.router.selection_bias  # 4 groups of 2 experts
        worst = choice.view(*choice.shape[:-1], 4, 2).sum(-1).argmin(-1)  # (B, T)
        override = torch.stack((2 * worst, 2 * worst + 1), dim=-1)
        assert not (r.natural_indices // 2 == worst[..., None]).any()  # a dropped group
        overrides.append(override)
    with torch.no_grad():
        replayed = policy(tokens, mask, routing_override=overrides, return_routing=True).routing
    for routing, override in zip(replayed, overrides, strict=True):
        _assert_replayed(routing, override, mask)


def test_the_aux_free_bias_trains_on_a_sigmoid_router_and_is_logged():
    cfg, policy, updater, data = _setup(balance={"aux_free_bias": True, "aux_free_bias_rate": 0.01})
    before = [layer.router.selection_bias.clone() for layer in policy.moe_layers]
    measure_batch(cfg, policy, updater, data)
    updater.update(data, 0, lr=cfg.optim.lr, entropy_coef=0.0)
    metrics = updater.stabilizers.end_step(0)
    for layer, old in zip(policy.moe_layers, before, strict=True):
        step = layer.router.selection_bias - old  # b += u sign(mean load - load)
        assert (((step.abs() - 0.01).abs() < 1e-6) | (step == 0)).all() and step.any()
    biases = torch.stack([layer.router.selection_bias for layer in policy.moe_layers])
    assert metrics[K.ROUTER_SELECTION_BIAS_ABS_MEAN] == float(biases.abs().mean())


def test_a_model_without_a_selection_bias_logs_none():
    cfg = ExperimentConfig.model_validate({"model": {"n_experts": 4}})
    stab = Stabilizers(cfg, TransformerLM(cfg.model, VOCAB), torch.device("cpu"))
    assert stab.selection_bias_metrics() == {}


def test_the_router_noise_dose_moves_a_sigmoid_routers_choice_not_its_gates():
    """rollout.router_noise on a sigmoid router: noise in logit units before the
    sigmoid, the choice moves, the gates stay the clean affinities of the choice."""
    cfg, policy, _, data = _setup()
    clean = RolloutEngine(cfg.model, VOCAB, precision="fp32")
    clean.load_weights(policy.state_dict())
    noise = RouterNoise(0.5, "fixed", cfg.model.n_moe_blocks, 64, 8, seed=0)
    noisy = RolloutEngine(cfg.model, VOCAB, precision="fp32", router_noise=noise)
    noisy.load_weights(policy.state_dict())
    _, a = clean.score(data.tokens, data.attention_mask)
    _, b = noisy.score(data.tokens, data.attention_mask)
    real = data.attention_mask
    moved = sum(
        int(routing_differs(x, y)[real].sum()) for x, y in zip(a.unpack(), b.unpack(), strict=True)
    )
    assert moved > 0
    # the noisy engine's experts, replayed in training, carry the clean affinities
    with torch.no_grad():
        replayed = policy(data.tokens, real, routing_override=b.unpack(), return_routing=True)
    for routing, recorded in zip(replayed.routing, b.unpack(), strict=True):
        _assert_replayed(routing, recorded, real)
