"""Router temperature controller; temperature and noisy top-k selection."""

import pytest
import torch

from trainer.config import RouterTemperatureConfig
from trainer.model.noisy_gating import NoiseScale, noisy_topk_logits
from trainer.stabilizers.temperature import RouterTemperatureController

torch.set_num_threads(1)

BALANCED = torch.full((4,), 0.25)  # utilization 1, no monopoly
IDLE = torch.tensor([0.4, 0.35, 0.25, 0.0])  # utilization 3/4 < 0.8, max share .4 < 3 * .25
MONOPOLY = torch.tensor([0.85, 0.05, 0.05, 0.05])  # .85 > 3 * .25; utilization 1/4


def controller(**overrides):
    fields = {"enabled": True, "interval": 10, "min_utilization": 0.8} | overrides
    return RouterTemperatureController(RouterTemperatureConfig(**fields))


def test_utilization_is_the_mean_over_layers():
    # layer utilizations: IDLE 3/4 (expert 3 below 1/(2E)), BALANCED 1 -> mean 0.875
    assert controller(min_utilization=0.8).update(10, [IDLE, BALANCED]) == 1.0
    assert controller(min_utilization=0.9).update(10, [IDLE, BALANCED]) == pytest.approx(0.9)


def test_cool_on_low_utilization():
    c = controller()
    assert c.update(10, [IDLE]) == pytest.approx(0.9)
    assert c.last_action == "cool"
    assert c.update(20, [IDLE]) == pytest.approx(0.81)


def test_heat_on_monopoly_and_monopoly_wins():
    c = controller()
    # MONOPOLY also has utilization 1/4 < 0.8: both conditions hold, heating wins
    assert c.update(10, [MONOPOLY]) == pytest.approx(1.1)
    assert c.last_action == "heat"
    c = controller(heat_factor=1.5)
    assert c.update(10, [BALANCED, MONOPOLY * 100]) == pytest.approx(1.5)  # counts work too


def test_no_change_when_healthy():
    c = controller()
    assert c.update(10, [BALANCED, BALANCED]) == 1.0
    assert c.last_action is None


def test_acts_only_on_interval_steps():
    c = controller()
    for step in (0, 1, 5, 9, 11, 19):
        assert c.update(step, [IDLE]) == 1.0
    assert c.update(20, [IDLE]) == pytest.approx(0.9)
    disabled = controller(enabled=False)
    assert disabled.update(10, [IDLE]) == 1.0


def test_clamps_to_the_bounds():
    c = controller(initial=0.2, min_temperature=0.19)
    assert c.update(10, [IDLE]) == pytest.approx(0.19)  # 0.18 clamped
    c = controller(initial=9.5, max_temperature=10.0)
    assert c.update(10, [MONOPOLY]) == pytest.approx(10.0)  # 10.45 clamped


def test_state_round_trip():
    c = controller()
    c.update(10, [IDLE])
    restored = controller()
    restored.load_state_dict(c.state_dict())
    assert restored.temperature == pytest.approx(0.9)


def test_selection_without_noise_ignores_temperature():
    logits = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))
    reference = logits.topk(2).indices
    for t in (0.5, 1.0, 2.0):
        assert torch.equal((logits / t).topk(2).indices, reference)
        # the gate weights do change with T
        gates = torch.softmax(logits / t, dim=-1).gather(1, reference)
        gates = gates / gates.sum(-1, keepdim=True)
        if t != 1.0:
            base = torch.softmax(logits, dim=-1).gather(1, reference)
            assert not torch.allclose(gates, base / base.sum(-1, keepdim=True))


def test_selection_with_noise_depends_on_temperature():
    logits = torch.randn(2048, 8, generator=torch.Generator().manual_seed(0))
    clean = logits.topk(2).indices.sort(-1).values
    std = torch.full((8,), 0.5)
    changed = {}
    for t in (0.5, 1.0, 2.0):
        noisy = noisy_topk_logits(logits / t, std, torch.Generator().manual_seed(1))
        chosen = noisy.topk(2).indices.sort(-1).values
        changed[t] = float((chosen != clean).any(-1).float().mean())
    # same noise draw, so only T differs: larger T, smaller logit gaps, more changed picks
    assert 0.0 < changed[0.5] < changed[1.0] < changed[2.0]
    assert changed[2.0] - changed[0.5] > 0.1


def test_noise_shapes_and_scale():
    logits = torch.zeros(4000, 3)
    out = noisy_topk_logits(logits, torch.tensor([0.0, 1.0, 3.0]), torch.Generator().manual_seed(2))
    assert torch.equal(out[:, 0], torch.zeros(4000))
    assert out[:, 1].std().item() == pytest.approx(1.0, rel=0.05)
    assert out[:, 2].std().item() == pytest.approx(3.0, rel=0.05)
    per_token = torch.zeros(4000, 3)
    per_token[:2000] = 1.0
    out = noisy_topk_logits(logits, per_token, torch.Generator().manual_seed(2))
    assert out[2000:].abs().max().item() == 0.0 and out[:2000].std().item() > 0.9


def test_noise_scale_is_a_learned_softplus():
    scale = NoiseScale(5, init_std=0.7)
    torch.testing.assert_close(scale(), torch.full((5,), 0.7))
    noisy = noisy_topk_logits(torch.zeros(3, 5), scale(), torch.Generator().manual_seed(0))
    noisy.pow(2).sum().backward()
    assert scale.raw.grad is not None and scale.raw.grad.abs().sum() > 0
