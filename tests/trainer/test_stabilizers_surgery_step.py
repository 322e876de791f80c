"""Gradient surgery in a backward step, on a tiny module with hand-computed gradients."""

import math

import pytest
import torch
from torch import nn

from trainer import metric_keys as mk
from trainer.stabilizers.surgery_step import SurgeryStats, surgery_backward, surgery_metrics

torch.set_num_threads(1)


class Tiny(nn.Module):
    """router weight w_r = (1, 2), body weight w_b = 3, plus a parameter no loss uses."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(2, 1, bias=False)
        self.body = nn.Linear(1, 1, bias=False)
        self.unused = nn.Parameter(torch.ones(1))
        with torch.no_grad():
            self.router.weight.copy_(torch.tensor([[1.0, 2.0]]))
            self.body.weight.fill_(3.0)

    def losses(self) -> tuple[torch.Tensor, torch.Tensor]:
        w_r, w_b = self.router.weight[0], self.body.weight[0, 0]
        # g_p: router (2, 0), body 5
        policy = w_r @ torch.tensor([2.0, 0.0]) + 5.0 * w_b
        # g_r: router (-1, 1) * w_b / 3 = (-1, 1), body (w_r . (-1, 1)) / 3 = 1/3
        routing = (w_r @ torch.tensor([-1.0, 1.0])) * w_b / 3.0
        return policy, routing


def test_router_scope_projects_only_the_router():
    model = Tiny()
    policy, routing = model.losses()
    stats = surgery_backward(list(model.parameters()), policy, routing, [model.router.weight])
    # cos = -2 / (2 * sqrt 2); g_r <- (-1, 1) - (-2 / 4) (2, 0) = (0, 1)
    assert stats.projected and stats.cos == pytest.approx(-1 / math.sqrt(2))
    torch.testing.assert_close(model.router.weight.grad, torch.tensor([[2.0, 1.0]]))
    routing_part = model.router.weight.grad[0] - torch.tensor([2.0, 0.0])
    assert float(routing_part @ torch.tensor([2.0, 0.0])) == pytest.approx(0.0, abs=1e-7)
    # outside the scope: the plain sum 5 + 1/3
    torch.testing.assert_close(model.body.weight.grad, torch.tensor([[5.0 + 1 / 3]]))
    assert model.unused.grad is None


def test_all_scope_projects_the_joint_vector():
    model = Tiny()
    policy, routing = model.losses()
    params = list(model.parameters())
    stats = surgery_backward(params, policy, routing, params)
    # g_p = (2, 0, 5), g_r = (-1, 1, 1/3): dot = -1/3, ||g_p||^2 = 29
    g_p = torch.tensor([2.0, 0.0, 5.0])
    g_r = torch.tensor([-1.0, 1.0, 1 / 3]) + (1 / 3) / 29 * g_p
    assert stats.projected
    assert stats.cos == pytest.approx(-(1 / 3) / (math.sqrt(29) * math.sqrt(2 + 1 / 9)))
    got = torch.cat([model.router.weight.grad[0], model.body.weight.grad[0]])
    torch.testing.assert_close(got, g_p + g_r)
    assert float((got - g_p) @ g_p) == pytest.approx(0.0, abs=1e-6)


def test_agreeing_gradients_give_the_plain_backward_and_accumulate():
    model = Tiny()
    policy, _ = model.losses()
    model.body.weight.grad = torch.tensor([[1.0]])
    stats = surgery_backward(list(model.parameters()), policy, 0.5 * policy, [model.router.weight])
    assert not stats.projected and stats.cos == pytest.approx(1.0)
    torch.testing.assert_close(model.router.weight.grad, torch.tensor([[3.0, 0.0]]))
    torch.testing.assert_close(model.body.weight.grad, torch.tensor([[1.0 + 7.5]]))  # added


@pytest.mark.parametrize(("seed", "conflict"), [(0, True), (1, False)])
def test_small_mlp_against_the_plain_backward(seed, conflict):
    """Scope = the first layer, shared by both heads; the second layer is outside it."""
    torch.manual_seed(seed)
    mlp = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(5, 3)

    def losses():
        out = mlp(x)
        return out[:, 0].pow(2).mean(), out[:, 1].mean()

    params, scope = list(mlp.parameters()), list(mlp[0].parameters())
    g_p = torch.autograd.grad(losses()[0], params)
    g_r = torch.autograd.grad(losses()[1], params)
    stats = surgery_backward(params, *losses(), scope)
    assert stats.projected == conflict
    for i in (2, 3):  # outside the scope: always the plain sum
        torch.testing.assert_close(params[i].grad, g_p[i] + g_r[i])
    routing_part = torch.cat([(params[i].grad - g_p[i]).reshape(-1) for i in (0, 1)])
    flat_p = torch.cat([g_p[i].reshape(-1) for i in (0, 1)])
    if conflict:
        assert float(routing_part @ flat_p) == pytest.approx(0.0, abs=1e-6)
    else:
        flat_r = torch.cat([g_r[i].reshape(-1) for i in (0, 1)])
        torch.testing.assert_close(routing_part, flat_r)


def test_routing_loss_without_graph():
    model = Tiny()
    policy, _ = model.losses()
    stats = surgery_backward(
        list(model.parameters()), policy, torch.tensor(0.0), [model.router.weight]
    )
    assert stats == SurgeryStats(cos=0.0, projected=False)
    torch.testing.assert_close(model.router.weight.grad, torch.tensor([[2.0, 0.0]]))


def test_metrics_are_means_over_minibatches():
    stats = [
        SurgeryStats(-0.5, True),
        SurgeryStats(0.25, False),
        SurgeryStats(-0.2, True),
        SurgeryStats(0.05, False),
    ]
    metrics = surgery_metrics(stats)
    assert metrics[mk.GRADS_COS_POLICY_AUX] == pytest.approx(-0.1)
    assert metrics[mk.GRADS_SURGERY_FRAC] == pytest.approx(0.5)
    assert surgery_metrics([]) == {}
