"""The fused MoE experts (trainer.model.moe_fused) against the reference layer on the
CPU: the same outputs and gradients to float rounding, fp32 and bf16, with replayed
routing; the choice of layer."""

from __future__ import annotations

import pytest
import torch

from trainer.model.dispatch import experts_swiglu
from trainer.model.moe import MoELayer
from trainer.model.moe_fused import choose_moe_layer, experts_swiglu_fused


def _inputs(dtype, n=48, d=32, e=8, k=2, h=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=dtype)
    logits = torch.randn(n, e, generator=gen)
    indices = logits.topk(k, dim=-1).indices
    gates = logits.softmax(-1).gather(-1, indices)
    gates = gates / gates.sum(-1, keepdim=True)
    w = [torch.randn(e, d, h, generator=gen, dtype=dtype) * 0.2,
         torch.randn(e, d, h, generator=gen, dtype=dtype) * 0.2,
         torch.randn(e, h, d, generator=gen, dtype=dtype) * 0.2]  # fmt: skip
    return x, gates, indices, w


def _run(fn, dtype, backend, inputs):
    x, gates, indices, w = inputs
    leaves = [t.to(dtype).clone().requires_grad_(True) for t in (x, gates, *w)]
    y = fn(leaves[0], leaves[1], indices, *leaves[2:], backend)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    y.backward(grad.to(dtype))
    return [y.detach().double(), *(t.grad.double() for t in leaves)]


NAMES = ["y", "x", "gates", "w_gate", "w_up", "w_down"]


@pytest.mark.parametrize("backend", ["grouped_mm", "padded", "loop"])
def test_fused_experts_match_the_reference_in_fp32(backend):
    inputs = _inputs(torch.float32)
    ref = _run(experts_swiglu, torch.float32, backend, inputs)
    fused = _run(experts_swiglu_fused, torch.float32, backend, inputs)
    for name, a, b in zip(NAMES, ref, fused, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("backend", ["grouped_mm", "padded", "loop"])
def test_fused_experts_in_bf16_are_as_accurate_as_the_reference(backend):
    """bf16 rounds differently along the two paths: each result is compared with the
    fp64 computation, and the fused one's error is at most the reference's plus a
    bf16 ulp of its largest value."""
    inputs = _inputs(torch.float32)
    exact = _run(experts_swiglu, torch.float64, "loop", inputs)
    ref = _run(experts_swiglu, torch.bfloat16, backend, inputs)
    fused = _run(experts_swiglu_fused, torch.bfloat16, backend, inputs)
    for name, e, a, b in zip(NAMES, exact, ref, fused, strict=True):
        ulp = e.abs().max().item() * 2**-7
        assert (b - e).abs().max() <= (a - e).abs().max() + ulp, name


def test_a_moe_layer_runs_the_fused_experts_where_chosen_with_replayed_routing():
    torch.manual_seed(0)
    layer = MoELayer(32, 8, 2, 16)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(3, 7, 32)
    replay = torch.randint(0, 8, (3, 7, 2))
    outs = []
    for kind in ("reference", "fused"):
        layer.layer_kind = kind
        layer.zero_grad()
        y, _ = layer(x, routing_override=replay, return_routing=True)
        y.square().sum().backward()
        outs.append((y.detach(), [p.grad.clone() for p in layer.parameters()]))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(outs[0][1], outs[1][1], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)  # the router's too


def test_auto_picks_the_fused_layer_on_cuda_only():
    assert choose_moe_layer("auto", "cuda") == "fused"
    assert choose_moe_layer("auto", "cpu") == "reference"
    assert choose_moe_layer("fused", "cpu") == "fused"
    with pytest.raises(ValueError, match="moe_layer"):
        choose_moe_layer("fast", "cpu")
