"""Load-balancing terms against hand-computed values."""

import math

import pytest
import torch

from trainer.algorithms.balance import aux_free_bias_update, router_z_loss, switch_aux_loss
from trainer.algorithms.measure import expert_load, max_violation

torch.set_num_threads(1)

PROBS = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
TOP1 = torch.tensor([[0], [0], [0], [1]])


def test_switch_aux_loss_global():
    probs = PROBS.clone().requires_grad_(True)
    loss = switch_aux_loss(probs, TOP1, n_experts=2)
    # f = [3/4, 1/4], P = [.65, .35] -> 2 * (.4875 + .0875) = 1.15
    assert loss.item() == pytest.approx(1.15)
    loss.backward()
    # d/dp_{n,i} = E * f_i / N = [2*.75/4, 2*.25/4]
    torch.testing.assert_close(probs.grad, torch.tensor([[0.375, 0.125]] * 4))


def test_switch_aux_loss_mask_and_uniform_value():
    mask = torch.tensor([True, True, True, False])
    # f = [1, 0], P = [(.9+.8+.6)/3, .] -> 2 * .766667 = 1.533333
    assert float(switch_aux_loss(PROBS, TOP1, 2, mask)) == pytest.approx(2 * 2.3 / 3)
    uniform = torch.full((4, 4), 0.25)
    top2 = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]])
    assert float(switch_aux_loss(uniform, top2, 4)) == pytest.approx(1.0)


def test_switch_aux_loss_per_sequence():
    seq_ids = torch.tensor([7, 7, 3, 3])
    loss = switch_aux_loss(PROBS, TOP1, 2, scope="sequence", seq_ids=seq_ids)
    # seq 7: f [1, 0], P [.85, .15] -> 1.7 ; seq 3: f [.5, .5], P [.45, .55] -> 1.0 ; mean 1.35
    assert float(loss) == pytest.approx(1.35)
    with pytest.raises(ValueError):
        switch_aux_loss(PROBS, TOP1, 2, scope="sequence")


def test_router_z_loss():
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)], [50.0, 50.0]])
    # lse = ln 2 -> .480453 ; ln 4 -> 1.921812 ; third token masked out
    mask = torch.tensor([True, True, False])
    assert float(router_z_loss(logits, mask)) == pytest.approx(1.2011325, abs=1e-6)
    assert float(router_z_loss(logits[:2])) == pytest.approx(1.2011325, abs=1e-6)


def test_aux_free_bias_update_signs():
    bias = torch.zeros(4)
    new = aux_free_bias_update(bias, torch.tensor([0.5, 0.25, 0.125, 0.125]), rate=1e-3)
    # mean load .25: overloaded expert 0 down, expert 1 at the mean unchanged, 2 and 3 up
    torch.testing.assert_close(new, torch.tensor([-1e-3, 0.0, 1e-3, 1e-3]))


def test_aux_free_bias_moves_load_towards_uniform():
    g = torch.Generator().manual_seed(0)
    n_experts, k = 8, 2
    scores = torch.randn(512, n_experts, generator=g)
    scores[:, 0] += 1.5  # expert 0 is everybody's favourite
    scores[:, 1] += 0.8
    mask = torch.ones(1, 512, dtype=torch.bool)
    bias = torch.zeros(n_experts)

    def load_with(b):
        top = (scores + b).topk(k, dim=-1).indices  # the bias changes selection only
        return expert_load(top[None], mask, n_experts)

    before = max_violation(load_with(bias))
    for _ in range(300):
        bias = aux_free_bias_update(bias, load_with(bias), rate=0.01)
    after = max_violation(load_with(bias))
    assert before > 1.0
    assert after < 0.1  # measured 1.70 -> 0.02
