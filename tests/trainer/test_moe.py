"""MoE layer: router numerics, top-k renormalisation, replay, dispatch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainer.model.dispatch import experts_swiglu, grouped_mm_supported
from trainer.model.moe import MoELayer, topk_gates


def make_layer(d=16, e=4, k=2, h=8, shared=0, backend="auto", seed=0) -> MoELayer:
    torch.manual_seed(seed)
    layer = MoELayer(d, e, k, h, shared, backend=backend)
    for p in layer.parameters():
        nn.init.normal_(p, std=0.3)
    return layer


def naive_moe(layer: MoELayer, x: torch.Tensor, indices: torch.Tensor, gates: torch.Tensor):
    """Per-token reference: y_t = sum_j g_tj * down(silu(x W_gate) * (x W_up))."""
    e = layer.experts
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(indices.shape[1]):
            ex = int(indices[t, j])
            hidden = torch.nn.functional.silu(x[t] @ e.w_gate[ex]) * (x[t] @ e.w_up[ex])
            out[t] += gates[t, j] * (hidden @ e.w_down[ex])
    return out


def test_topk_gates_renormalise_by_hand():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    probs = logits.softmax(-1)
    gates = topk_gates(probs, torch.tensor([[0, 1]]))
    # softmax restricted to {0, 1}: e^2 / (e^2 + e^1) = 1 / (1 + e^-1)
    expected_first = 1.0 / (1.0 + torch.exp(torch.tensor(-1.0)))
    torch.testing.assert_close(gates, torch.stack([expected_first, 1 - expected_first])[None])
    # Replayed (non-top) experts renormalise over their own probabilities.
    gates = topk_gates(probs, torch.tensor([[2, 3]]))
    expected = 1.0 / (1.0 + torch.exp(torch.tensor(-1.0)))
    torch.testing.assert_close(gates[0, 0], expected)


def test_router_natural_topk_and_gates_match_hand_computation():
    layer = make_layer()
    x = torch.randn(1, 5, 16)
    _, routing = layer(x, return_routing=True)
    logits = x[0] @ layer.router.weight.T
    probs = logits.softmax(-1)
    top = logits.topk(2, dim=-1).indices
    assert torch.equal(routing.natural_indices[0], top)
    assert torch.equal(routing.used_indices[0], top)
    picked = probs.gather(-1, top)
    torch.testing.assert_close(routing.gates[0], picked / picked.sum(-1, keepdim=True))
    torch.testing.assert_close(routing.probs[0], probs)


@pytest.mark.parametrize("backend", ["grouped_mm", "loop"])
def test_dispatch_matches_per_token_reference(backend):
    if backend == "grouped_mm" and not grouped_mm_supported(torch.zeros(1)):
        pytest.skip("no grouped_mm kernel here")
    layer = make_layer(backend=backend)
    x = torch.randn(1, 7, 16)
    y, routing = layer(x, return_routing=True)
    ref = naive_moe(layer, x[0], routing.used_indices[0], routing.gates[0])
    torch.testing.assert_close(y[0], ref, rtol=1e-5, atol=1e-5)


def test_backends_agree_including_gradients():
    if not grouped_mm_supported(torch.zeros(1)):
        pytest.skip("no grouped_mm kernel here")
    grads = {}
    for backend in ("grouped_mm", "loop"):
        layer = make_layer(backend=backend, seed=3)
        x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(5), requires_grad=True)
        y, _ = layer(x)
        y.square().sum().backward()
        grads[backend] = (y.detach(), x.grad, layer.experts.w_gate.grad, layer.router.weight.grad)
    for a, b in zip(grads["grouped_mm"], grads["loop"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_unused_expert_gets_zero_gradient_and_no_token_dropped():
    layer = make_layer(e=4, k=1)
    x = torch.randn(1, 6, 16)
    override = torch.zeros(1, 6, 1, dtype=torch.long)  # everything to expert 0
    y, _ = layer(x, routing_override=override)
    y.sum().backward()
    assert layer.experts.w_gate.grad[1:].abs().sum() == 0
    assert (y.abs().sum(-1) > 0).all()  # every token computed (no capacity dropping)


def test_override_equal_to_natural_is_bit_identical():
    layer = make_layer(shared=8)
    x = torch.randn(2, 6, 16)
    y_nat, routing = layer(x, return_routing=True)
    y_rep, routing_rep = layer(x, routing_override=routing.natural_indices, return_routing=True)
    assert torch.equal(y_nat, y_rep)
    assert torch.equal(routing.gates, routing_rep.gates)


def test_different_override_keeps_router_gradient():
    layer = make_layer(e=4, k=2)
    x = torch.randn(1, 6, 16)
    _, routing = layer(x, return_routing=True)
    # Replay experts the router did NOT pick (the complement of its top-2 of 4).
    all_experts = torch.arange(4).expand(1, 6, 4)
    natural = routing.natural_indices
    not_picked = ~(all_experts[..., None] == natural[..., None, :]).any(-1)
    override = all_experts[not_picked].view(1, 6, 2)
    y, routing_rep = layer(x, routing_override=override, return_routing=True)
    assert torch.equal(routing_rep.used_indices, override)
    assert torch.equal(routing_rep.natural_indices, natural)
    y.square().sum().backward()
    assert layer.router.weight.grad is not None
    assert layer.router.weight.grad.abs().sum() > 0


def test_override_mask_mixes_replayed_and_natural():
    layer = make_layer(e=4, k=1)
    x = torch.randn(1, 4, 16)
    _, routing = layer(x, return_routing=True)
    override = (routing.natural_indices + 1) % 4
    keep = torch.tensor([[True, False, True, False]])
    _, mixed = layer(x, routing_override=override, override_mask=keep, return_routing=True)
    expected = torch.where(keep[..., None], override, routing.natural_indices)
    assert torch.equal(mixed.used_indices, expected)


def test_router_runs_in_fp32_under_bf16_autocast():
    layer = make_layer()
    x = torch.randn(1, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, routing = layer(x, return_routing=True)
    assert routing.logits.dtype == torch.float32
    assert routing.probs.dtype == torch.float32
    assert routing.gates.dtype == torch.float32
    torch.testing.assert_close(routing.logits[0], x[0] @ layer.router.weight.T)
    assert torch.isfinite(y).all()


def test_selection_bias_changes_selection_not_gate_probabilities():
    layer = make_layer(e=4, k=1)
    x = torch.randn(1, 5, 16)
    layer.router.selection_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 100.0]))
    _, routing = layer(x, return_routing=True)
    assert (routing.natural_indices == 3).all()
    unbiased = (x[0] @ layer.router.weight.T).softmax(-1)
    torch.testing.assert_close(routing.probs[0], unbiased)


def test_router_temperature_divides_logits():
    layer = make_layer()
    x = torch.randn(1, 3, 16)
    _, base = layer(x, return_routing=True)
    layer.router.temperature.fill_(2.0)
    _, hot = layer(x, return_routing=True)
    torch.testing.assert_close(hot.logits, base.logits / 2)


def test_no_routing_returned_unless_asked():
    layer = make_layer()
    _, routing = layer(torch.randn(1, 3, 16))
    assert routing is None


def test_experts_swiglu_handles_empty_experts():
    torch.manual_seed(0)
    x = torch.randn(5, 8)
    w_gate, w_up, w_down = torch.randn(6, 8, 4), torch.randn(6, 8, 4), torch.randn(6, 4, 8)
    indices = torch.tensor([[0, 5]] * 5)  # experts 1-4 get no tokens
    gates = torch.full((5, 2), 0.5)
    y = experts_swiglu(x, gates, indices, w_gate, w_up, w_down)
    silu = torch.nn.functional.silu
    ref = 0.5 * sum((silu(x @ w_gate[e]) * (x @ w_up[e])) @ w_down[e] for e in (0, 5))
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
