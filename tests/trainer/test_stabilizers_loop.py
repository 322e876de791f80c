"""The stabilizers wired into real forwards: replay (R3, R2), routing transport,
balance losses, aux-free bias, noisy gating, temperature sync, per-expert clipping.

The rollouts come from the real rollout engine in emulated bf16, so the routing gap
R3 removes is the engine's own, not a constructed one.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.trainer.conftest import left_padded_batch
from trainer import metric_keys as K
from trainer.algorithms.balance import router_z_loss, switch_aux_loss
from trainer.algorithms.measure import expert_load, max_violation, routing_differs
from trainer.config import ExperimentConfig
from trainer.model import LayerRouting, TransformerLM, topk_gates
from trainer.rollout import RolloutEngine, prompt_logprobs
from trainer.rollout.data import RolloutData, ship_routing
from trainer.run.measure_step import measure_batch
from trainer.run.update import PolicyUpdater
from trainer.stabilizers.loop import Stabilizers

VOCAB = 24
MODEL = {"n_layers": 2, "d_model": 64, "n_heads": 4, "n_experts": 8, "top_k": 2,
         "expert_hidden": 64, "max_seq_len": 64}  # fmt: skip


def make_cfg(optim: dict | None = None, **stabilizers) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "model": MODEL,
            "rollout": {"group_size": 4, "precision": "bf16"},
            "algorithm": {"minibatches": 4, "kl_coef": 0.0},
            "optim": {"lr": 1e-2, **(optim or {})},
            "stabilizers": stabilizers,
        }
    )


def rollout_setup(optim: dict | None = None, **stabilizers):
    """Policy, updater and one bf16-engine rollout batch of 16 sequences."""
    cfg = make_cfg(optim, **stabilizers)
    torch.manual_seed(0)
    policy = TransformerLM(cfg.model, VOCAB)
    updater = PolicyUpdater(cfg, policy, None, torch.Generator().manual_seed(1))
    engine = RolloutEngine(cfg.model, VOCAB, precision="bf16")
    engine.load_weights(policy.state_dict())
    prompts, prompt_mask = left_padded_batch(VOCAB, [24, 20, 16, 12] * 4, 24, seed=1)
    rollout = engine.generate(
        prompts, prompt_mask, max_new_tokens=8, generator=torch.Generator().manual_seed(2)
    )
    rewards = (torch.arange(16) % 3 == 0).float()
    data = RolloutData.from_rollout(rollout, rewards, cfg.stabilizers.replay.compression)
    return cfg, policy, updater, data


def update_routings(updater: PolicyUpdater, data: RolloutData):
    """Run ``updater.update`` and return, per minibatch, (rows, [LayerRouting per layer]).

    The update forwards return routing because a balance loss is on in these configs;
    the rows are reproduced from a copy of the shuffle generator (one epoch).
    """
    assert updater.stabilizers.needs_routing
    shuffle = torch.Generator()
    shuffle.set_state(updater.shuffle_generator.get_state())
    order = torch.randperm(data.batch_size, generator=shuffle)
    chunks = order.chunk(min(updater.cfg.algorithm.minibatches, data.batch_size))
    seen: list[LayerRouting] = []
    hooks = [
        layer.register_forward_hook(lambda mod, args, out: seen.append(out[1]))
        for layer in updater.policy.moe_layers
    ]
    try:
        updater.update(data, 0, lr=updater.cfg.optim.lr, entropy_coef=0.0)
    finally:
        for hook in hooks:
            hook.remove()
    n_layers = len(updater.policy.moe_layers)
    assert len(seen) == n_layers * len(chunks)
    return [(rows, seen[i * n_layers : (i + 1) * n_layers]) for i, rows in enumerate(chunks)]


# --------------------------------------------------------------------------- replay
def test_r3_trains_on_the_rollout_routing_while_the_natural_gap_is_still_measured():
    cfg, policy, updater, data = rollout_setup(replay={"mode": "r3"}, balance={"z_loss_coef": 1e-3})
    metrics = updater.stabilizers.begin_step(0, data)
    assert metrics[K.R3_REPLAYED_FRAC] == 1.0  # no warm-up: every recorded pair replays
    metrics.update(measure_batch(cfg, policy, updater, data))
    assert metrics[K.MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY] == 0.0
    assert metrics[K.MISMATCH_ROUTING_INCONSISTENCY] > 0.0  # the bf16 engine's real gap

    seen = data.routing_mask & data.attention_mask
    for rows, layers in update_routings(updater, data):
        for routing, recorded in zip(layers, data.rollout_routing, strict=True):
            differs = routing_differs(routing.used_indices, recorded[rows])
            assert not differs[seen[rows]].any()


def test_r2_replays_the_old_policy_routing_not_the_engine_one():
    cfg, policy, updater, data = rollout_setup(replay={"mode": "r2"}, balance={"z_loss_coef": 1e-3})
    assert updater.stabilizers.begin_step(0, data) == {}  # R2 has no engine mask
    metrics = measure_batch(cfg, policy, updater, data)
    # The measure forward is the old policy itself: nothing replayed there.
    assert metrics[K.MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY] == pytest.approx(
        metrics[K.MISMATCH_ROUTING_INCONSISTENCY]
    )
    old = [idx.clone() for idx in data.old_routing]
    real = data.attention_mask
    drift = gap = 0
    for rows, layers in update_routings(updater, data):
        for routing, old_idx, engine_idx in zip(layers, old, data.rollout_routing, strict=True):
            assert not routing_differs(routing.used_indices, old_idx[rows])[real[rows]].any()
            drift += int(routing_differs(routing.natural_indices, old_idx[rows])[real[rows]].sum())
            gap += int(routing_differs(routing.used_indices, engine_idx[rows])[real[rows]].sum())
    assert drift > 0  # later minibatches' routers moved: R2 pins them to the old routing
    assert gap > 0  # ... which is the training side's routing, not the engine's


def test_r3_warmup_keeps_a_share_of_pairs_on_the_training_router():
    _, _, updater, data = rollout_setup(
        replay={"mode": "r3", "warmup_steps": 10, "warmup_keep_frac": 0.5}
    )
    stabilizers = updater.stabilizers
    seen = data.routing_mask & data.attention_mask
    frac = stabilizers.begin_step(0, data)[K.R3_REPLAYED_FRAC]
    assert frac == pytest.approx(0.5, abs=0.06)
    assert all(not (mask & ~seen).any() for mask in data.replay_mask)  # never beyond the engine
    assert stabilizers.begin_step(5, data)[K.R3_REPLAYED_FRAC] == pytest.approx(0.75, abs=0.06)
    assert stabilizers.begin_step(10, data)[K.R3_REPLAYED_FRAC] == 1.0


@pytest.mark.parametrize("compression", ["none", "rle", "zlib"])
def test_routing_travels_packed_and_arrives_intact(compression):
    cfg, policy, _, data = rollout_setup()
    engine = RolloutEngine(cfg.model, VOCAB, precision="bf16")
    engine.load_weights(policy.state_dict())
    _, routing = engine.score(data.tokens, data.attention_mask)
    shipped = ship_routing(routing, compression)
    assert all(torch.equal(a, b) for a, b in zip(shipped.indices, routing.unpack(), strict=True))
    if compression == "none":  # 8 experts: 3 bits per index, top-2
        assert shipped.bytes_per_token_layer == pytest.approx(0.75, abs=1e-3)


# --------------------------------------------------------------------------- balance losses
def test_balance_losses_use_natural_or_used_experts_as_configured():
    torch.manual_seed(3)
    logits = torch.randn(2, 5, 8, requires_grad=True)
    probs = logits.softmax(-1)
    natural = logits.topk(2, dim=-1).indices
    used = torch.randint(0, 8, (2, 5, 2))
    routing = [LayerRouting(logits, probs, natural, used, topk_gates(probs, used))]
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[0, :2] = False
    flat = mask.reshape(-1)
    for from_natural, idx in ((True, natural), (False, used)):
        cfg = make_cfg(
            balance={"aux_loss_coef": 0.5, "z_loss_coef": 0.25,
                     "lb_from_natural_routing": from_natural}
        )  # fmt: skip
        stab = Stabilizers(cfg, TransformerLM(cfg.model, VOCAB), torch.device("cpu"))
        loss, stats = stab.routing_loss(routing, mask)
        aux = switch_aux_loss(probs.reshape(-1, 8), idx.reshape(-1, 2), 8, flat)
        z = router_z_loss(logits.reshape(-1, 8), flat)
        torch.testing.assert_close(loss, 0.5 * aux + 0.25 * z)
        assert stats == {K.LB_AUX_LOSS: pytest.approx(aux.item()), K.LB_Z_LOSS: z.item()}
        assert loss.requires_grad


def test_plain_runs_ask_for_no_routing_and_pay_no_routing_loss():
    cfg = make_cfg()
    stab = Stabilizers(cfg, TransformerLM(cfg.model, VOCAB), torch.device("cpu"))
    assert not stab.needs_routing
    loss, stats = stab.routing_loss(None, torch.ones(2, 3, dtype=torch.bool))
    assert float(loss) == 0.0 and not loss.requires_grad and stats == {}


def test_router_kl_anchors_to_earlier_steps_only():
    cfg, policy, updater, data = rollout_setup(
        balance={"router_kl_coef": 0.1, "router_kl_buffer_steps": 2}
    )
    stab = updater.stabilizers
    measure_batch(cfg, policy, updater, data)
    metrics = updater.update(data, 0, lr=cfg.optim.lr, entropy_coef=0.0)
    assert metrics[K.LB_ROUTER_KL] == 0.0  # empty buffer at the first step
    stab.end_step(0)
    assert len(stab.anchor) == 1
    measure_batch(cfg, policy, updater, data)
    metrics = updater.update(data, 1, lr=cfg.optim.lr, entropy_coef=0.0)
    assert metrics[K.LB_ROUTER_KL] > 0.0  # the router moved away from step 0's marginal


# --------------------------------------------------------------------------- aux-free bias
def _imbalanced_model(cfg: ExperimentConfig):
    """A model whose routers send most tokens to the low-numbered experts.

    Every router row gets a graded multiple of the mean router input, so the
    logits of expert e are shifted by (E - 1 - e) * s for every token.
    """
    torch.manual_seed(4)
    model = TransformerLM(cfg.model, VOCAB).eval()
    tokens, mask = left_padded_batch(VOCAB, [24] * 16, 24, seed=5)
    inputs: list[torch.Tensor] = []
    hooks = [
        layer.router.register_forward_pre_hook(lambda mod, args: inputs.append(args[0]))
        for layer in model.moe_layers
    ]
    with torch.no_grad():
        model(tokens, attention_mask=mask)
        for layer, x in zip(model.moe_layers, inputs, strict=True):
            direction = x.mean(0) / x.mean(0).norm()
            grade = torch.arange(cfg.model.n_experts - 1, -1, -1, dtype=torch.float32)
            layer.router.weight.add_(0.3 * grade[:, None] * direction[None, :])
    for hook in hooks:
        hook.remove()
    return model, tokens, mask


def test_aux_free_bias_moves_load_toward_uniform_and_leaves_gates_alone():
    # u = 0.05 instead of DeepSeek-V3's 1e-3, to undo logit gaps of order 1 in 80 steps.
    cfg = make_cfg(balance={"aux_free_bias": True, "aux_free_bias_rate": 0.05})
    model, tokens, mask = _imbalanced_model(cfg)
    stab = Stabilizers(cfg, model, torch.device("cpu"))

    def forward():
        with torch.no_grad():
            return model(tokens, attention_mask=mask, return_routing=True).routing

    def worst_violation(routing) -> float:
        return max(max_violation(expert_load(r.natural_indices, mask, 8)) for r in routing)

    before = worst_violation(forward())
    assert before > 2.5  # constructed imbalance: two experts take almost every assignment
    for step in range(80):
        stab.observe(forward(), mask)
        stab.end_step(step)
    routing = forward()
    after = worst_violation(routing)
    assert after < 0.2 * before  # measured: about 0.35 from 2.97
    for layer, r in zip(model.moe_layers, routing, strict=True):
        bias = layer.router.selection_bias
        assert bias.abs().max() > 0
        # Selection only: probabilities and gates come from the unbiased logits.
        torch.testing.assert_close(r.probs, r.logits.softmax(-1))
        torch.testing.assert_close(r.gates, topk_gates(r.probs, r.used_indices))
        biased = (r.logits + bias).topk(2, dim=-1).indices
        assert torch.equal(biased, r.natural_indices)


# --------------------------------------------------------------------------- noisy gating
def test_noisy_gating_only_in_training_forwards_and_only_for_selection():
    cfg, policy, updater, data = rollout_setup(noisy_gating={"enabled": True, "init_std": 5.0})
    clean = TransformerLM(cfg.model, VOCAB)
    clean.load_state_dict(policy.state_dict(), strict=False)  # no noise-scale parameters
    assert any("router.noise.raw" in name for name, _ in policy.named_parameters())

    def forward(model):
        return model(data.tokens, attention_mask=data.attention_mask, return_routing=True)

    with torch.no_grad():
        policy.eval()
        a, b, ref = forward(policy), forward(policy), forward(clean.eval())
        assert torch.equal(a.logits, ref.logits) and torch.equal(b.logits, ref.logits)
        policy.train()
        noisy = forward(policy)
    changed = sum(
        int(routing_differs(n.natural_indices, c.natural_indices)[data.attention_mask].sum())
        for n, c in zip(noisy.routing, ref.routing, strict=False)
    )
    assert changed > 0  # std 5 against logit gaps well below 1
    # Selection only: the first layer's logits (its input is noise-free) are the clean
    # ones, and in every layer the gates come from the softmax of the clean logits.
    assert torch.equal(noisy.routing[0].logits, ref.routing[0].logits)
    for n in noisy.routing:
        torch.testing.assert_close(n.gates, topk_gates(n.logits.softmax(-1), n.used_indices))

    # measure_batch runs in eval mode: old log-probs identical to the clean model's.
    clean_updater = PolicyUpdater(make_cfg(), clean, None, torch.Generator().manual_seed(1))
    clean_data = copy.copy(data)
    measure_batch(cfg, policy, updater, data)
    measure_batch(make_cfg(), clean, clean_updater, clean_data)
    assert torch.equal(data.old_logp, clean_data.old_logp)

    # The rollout engine takes the state_dict (noise scale included) and selects cleanly.
    engine = RolloutEngine(cfg.model, VOCAB, precision="fp32")
    engine.load_weights(policy.state_dict())
    _, routing = engine.score(data.tokens, data.attention_mask)
    for recorded, c in zip(routing.unpack(), ref.routing, strict=True):
        assert not routing_differs(recorded, c.natural_indices)[data.attention_mask].any()


# --------------------------------------------------------------------------- temperature
def test_training_model_and_engine_share_the_controller_temperature():
    cfg = make_cfg(router_temperature={"enabled": True, "interval": 1, "initial": 1.5,
                                       "monopoly_share": 1.0001, "heat_factor": 2.0})  # fmt: skip
    torch.manual_seed(0)
    model = TransformerLM(cfg.model, VOCAB).eval()
    stab = Stabilizers(cfg, model, torch.device("cpu"))
    assert all(float(layer.router.temperature) == 1.5 for layer in model.moe_layers)
    tokens, mask = left_padded_batch(VOCAB, [10] * 4, 10, seed=6)
    with torch.no_grad():
        stab.observe(model(tokens, attention_mask=mask, return_routing=True).routing, mask)
    stab.end_step(0)  # check at step 1: any uneven load is a "monopoly" at share 1.0001
    assert all(float(layer.router.temperature) == 3.0 for layer in model.moe_layers)
    engine = RolloutEngine(cfg.model, VOCAB, precision="fp32")
    engine.load_weights(model.state_dict())
    assert [layer.router_temperature for layer in engine.layers] == [3.0, 3.0]
    with torch.no_grad():
        train_logits = model(tokens, attention_mask=mask).logits
    engine_lp, _ = engine.score(tokens, mask)
    torch.testing.assert_close(
        engine_lp, prompt_logprobs(train_logits, tokens, mask), rtol=0, atol=1e-4
    )


# --------------------------------------------------------------------------- gradients
def test_parameter_groups_and_per_expert_clip_match_the_model_names():
    _, policy, updater, data = rollout_setup(optim={"per_expert_grad_clip": 1e-3})
    groups = {g["name"]: g["params"] for g in updater.optimizer.param_groups}
    layers = policy.moe_layers
    assert {id(p) for p in groups["router"]} == {id(layer.router.weight) for layer in layers}
    expert_ids = {id(p) for layer in layers for p in layer.experts.parameters()}
    assert {id(p) for p in groups["expert"]} == expert_ids and len(expert_ids) == 6

    out = policy(data.tokens, attention_mask=data.attention_mask)
    out.logits.square().mean().backward()
    updater.stabilizers.clip_experts()
    for layer in layers:
        e = layer.experts
        norms = torch.stack(
            [p.grad.reshape(8, -1).square().sum(1) for p in (e.w_gate, e.w_up, e.w_down)]
        ).sum(0).sqrt()  # fmt: skip
        assert (norms <= 1e-3 * (1 + 1e-4)).all()
        assert norms.max() > 0.5e-3  # the experts that got tokens sit at the bound
