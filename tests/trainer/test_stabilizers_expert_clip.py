"""Per-expert gradient clipping against hand-computed norms."""

import pytest
import torch
from torch import nn

from trainer.stabilizers.expert_clip import clip_expert_params_

torch.set_num_threads(1)


def test_each_expert_clipped_on_its_own():
    weight = nn.Parameter(torch.zeros(3, 1, 2))
    grads = weight.grad = torch.tensor([[[3.0, 4.0]], [[0.3, 0.4]], [[0.0, 0.0]]])  # (E=3, 1, 2)
    norms = clip_expert_params_([("moe.w", weight)], 1.0, lambda _: True)["moe"]  # 5, .5, 0
    torch.testing.assert_close(norms, torch.tensor([5.0, 0.5, 0.0]))
    # expert 0 scaled by 1 / (5 + 1e-6); the others untouched
    torch.testing.assert_close(grads[0], torch.tensor([[0.6, 0.8]]))
    torch.testing.assert_close(grads[1], torch.tensor([[0.3, 0.4]]))
    torch.testing.assert_close(grads[2], torch.zeros(1, 2))
    assert torch.linalg.vector_norm(grads[0]).item() == pytest.approx(1.0, abs=1e-6)


class TinyMoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(2, 2, bias=False)
        self.moe = nn.Module()
        self.moe.w_in = nn.Parameter(torch.zeros(2, 2, 1))  # (E, d, h)
        self.moe.w_out = nn.Parameter(torch.zeros(2, 1, 2))  # (E, h, d)
        self.other = nn.Module()
        self.other.w_in = nn.Parameter(torch.zeros(2, 1))  # another layer's experts (E=2)


def test_stacked_tensors_of_one_expert_share_one_norm():
    model = TinyMoE()
    model.router.weight.grad = torch.full((2, 2), 10.0)
    model.moe.w_in.grad = torch.tensor([[[2.0], [0.0]], [[0.1], [0.0]]])
    model.moe.w_out.grad = torch.tensor([[[0.0, 1.0]], [[0.0, 0.2]]])
    model.other.w_in.grad = torch.tensor([[4.0], [0.0]])

    def is_expert(name: str) -> bool:
        return ".w_" in name

    norms = clip_expert_params_(model.named_parameters(), 2.0, is_expert)
    # expert 0: sqrt(2^2 + 1^2) = sqrt 5 > 2 -> both tensors scaled by 2 / sqrt 5
    # expert 1: sqrt(.01 + .04) = .2236 < 2 -> untouched
    torch.testing.assert_close(norms["moe"], torch.tensor([5**0.5, 0.05**0.5]))
    s = 2.0 / (5**0.5 + 1e-6)
    torch.testing.assert_close(model.moe.w_in.grad[0], torch.tensor([[2.0 * s], [0.0]]))
    torch.testing.assert_close(model.moe.w_out.grad[0], torch.tensor([[0.0, s]]))
    torch.testing.assert_close(model.moe.w_in.grad[1], torch.tensor([[0.1], [0.0]]))
    torch.testing.assert_close(model.moe.w_out.grad[1], torch.tensor([[0.0, 0.2]]))
    # another layer is clipped by its own norms; the router is not an expert parameter
    torch.testing.assert_close(norms["other"], torch.tensor([4.0, 0.0]))
    torch.testing.assert_close(model.other.w_in.grad, torch.tensor([[2.0], [0.0]]))
    torch.testing.assert_close(model.router.weight.grad, torch.full((2, 2), 10.0))
