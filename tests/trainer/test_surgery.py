"""PCGrad projection against hand-computed vectors."""

import pytest
import torch

from trainer.algorithms.surgery import project_conflicting, project_conflicting_lists


def test_projection_divides_by_the_squared_norm():
    g_p = torch.tensor([1.0, 2.0, 2.0])  # ||g_p|| = 3
    g_r = torch.tensor([1.0, -2.0, 0.0])  # g_r . g_p = 1 - 4 = -3
    new, cos, projected = project_conflicting(g_r, g_p)
    assert projected
    assert cos == pytest.approx(-3 / (5**0.5 * 3))  # -0.447214
    # g_r - (-3 / 9) g_p = (1 + 1/3, -2 + 2/3, 0 + 2/3)
    torch.testing.assert_close(new, torch.tensor([4 / 3, -4 / 3, 2 / 3]))
    assert float(new @ g_p) == pytest.approx(0.0, abs=1e-6)


def test_non_unit_policy_gradient_catches_the_plain_norm_mistake():
    g_p = torch.tensor([2.0, 0.0])
    g_r = torch.tensor([-1.0, 1.0])
    new, _, _ = project_conflicting(g_r, g_p)
    # dot = -2, ||g_p||^2 = 4 -> g_r + 0.5 g_p = (0, 1); dividing by ||g_p|| = 2 would give (1, 1)
    torch.testing.assert_close(new, torch.tensor([0.0, 1.0]))


def test_unchanged_when_not_conflicting():
    g_p = torch.tensor([1.0, 0.0])
    for g_r in (torch.tensor([1.0, 1.0]), torch.tensor([0.0, 3.0])):  # cos > 0 and cos = 0
        new, cos, projected = project_conflicting(g_r, g_p)
        assert not projected and new is g_r and cos >= 0


def test_zero_norm_is_safe():
    new, cos, projected = project_conflicting(torch.tensor([1.0, -1.0]), torch.zeros(2))
    assert (cos, projected) == (0.0, False)
    torch.testing.assert_close(new, torch.tensor([1.0, -1.0]))
    _, cos, projected = project_conflicting(torch.zeros(2), torch.tensor([1.0, 0.0]))
    assert (cos, projected) == (0.0, False)


def test_lists_project_the_concatenated_vector():
    g_p = [torch.tensor([[1.0, 2.0]]), torch.tensor([2.0])]
    g_r = [torch.tensor([[1.0, -2.0]]), torch.tensor([0.0])]
    new, _, projected = project_conflicting_lists(g_r, g_p)
    assert projected
    torch.testing.assert_close(new[0], torch.tensor([[4 / 3, -4 / 3]]))
    torch.testing.assert_close(new[1], torch.tensor([2 / 3]))
