"""MoE backends: the choice per device, capability and dtype, and the sync-free
``padded`` path against the ``loop`` reference (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from trainer.devices import capability as device_props
from trainer.devices.sync_count import count_syncs
from trainer.model import dispatch as dispatch_mod
from trainer.model.dispatch import (
    Dispatch,
    PaddedLayout,
    choose_backend,
    expert_counts,
    experts_swiglu,
    padded_tile,
    resolve_backend,
)
from trainer.model.moe import MoELayer

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
A100, H100, B200, L4 = (8, 0), (9, 0), (10, 0), (8, 9)


@pytest.mark.parametrize(
    ("device", "dtype", "capability", "expected"),
    [
        ("cpu", FP32, None, "grouped_mm"),
        ("cpu", BF16, None, "grouped_mm"),
        ("cpu", FP16, None, "padded"),
        ("cuda", BF16, H100, "grouped_mm"),  # the fused kernel
        ("cuda", BF16, B200, "grouped_mm"),
        ("cuda", BF16, A100, "padded"),  # torch's sm80 grouped_mm syncs: never auto
        ("cuda", BF16, L4, "padded"),
        ("cuda", FP32, H100, "padded"),  # fp32 presets on any GPU
        ("cuda", FP32, A100, "padded"),
        ("cuda", FP16, H100, "padded"),
    ],
)
def test_auto_picks_by_capability_and_never_the_loop(device, dtype, capability, expected):
    assert choose_backend("auto", device, dtype, capability) == expected


def test_explicit_choices_are_kept_or_refused_never_swapped():
    assert choose_backend("loop", "cuda", FP32, H100) == "loop"
    assert choose_backend("padded", "cpu", FP32, None) == "padded"
    # grouped_mm where torch runs it (sm80: its own mm loop, syncs; asked for, so kept).
    assert choose_backend("grouped_mm", "cuda", BF16, A100) == "grouped_mm"
    with pytest.raises(ValueError, match=r"'grouped_mm' has no kernel for torch\.float32 on sm90"):
        choose_backend("grouped_mm", "cuda", FP32, H100)
    with pytest.raises(ValueError, match="unknown MoE backend 'fast'"):
        choose_backend("fast", "cpu", FP32, None)


def test_resolve_backend_passes_the_device_and_its_capability(monkeypatch):
    """resolve_backend asks trainer.devices.capability (the one place a test fakes)
    and hands device type, dtype and the answer to choose_backend."""
    seen = []
    monkeypatch.setattr(device_props, "device_capability", lambda device: A100)
    monkeypatch.setattr(dispatch_mod, "choose_backend", lambda *args: seen.append(args) or "padded")
    assert resolve_backend("auto", torch.zeros(2, dtype=BF16)) == "padded"
    assert seen == [("auto", "cpu", BF16, A100)]


def test_expert_counts_equal_bincount():
    ids = torch.tensor([3, 0, 3, 5, 3, 0])
    counts, offsets = expert_counts(ids.sort().values, 7)
    assert counts.tolist() == torch.bincount(ids, minlength=7).tolist()
    assert offsets.tolist() == torch.bincount(ids, minlength=7).cumsum(0).tolist()
    assert offsets.dtype == torch.int32


def test_padded_layout_by_hand():
    """counts (3, 0, 9), 12 rows over 3 experts: tile 8 (the power of two >= 12 / 3 = 4,
    at least 8), at most (12 + 3 * 7) // 8 = 4 blocks: expert 0 one (3 rows + 5 pads),
    expert 2 two (9 rows + 7 pads), and one block of padding only."""
    counts = torch.tensor([3, 0, 9])
    layout = PaddedLayout.build(counts, counts.cumsum(0).to(torch.int32), rows=12)
    assert padded_tile(12, 3) == layout.tile == 8
    assert layout.block_expert.tolist() == [0, 2, 2, 2]
    pad = 12  # the zero row
    assert layout.source.tolist() == (
        [0, 1, 2] + [pad] * 5 + list(range(3, 12)) + [pad] * 7 + [pad] * 8
    )
    assert layout.dest.tolist() == [0, 1, 2, *range(8, 17)]
    assert padded_tile(4096, 16) == 256 and padded_tile(4097, 16) == 512


def _moe_inputs(n=96, d=16, h=24, e=8, k=2, seed=0, routing="random"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    if routing == "one-expert":  # every token to experts 3 and 5; the rest get none
        indices = torch.tensor([[3, 5]]).repeat(n, 1)
    else:
        indices = torch.randn(n, e, generator=g).topk(k).indices
    gates = torch.rand(n, k, generator=g).softmax(-1)
    weights = [
        torch.randn(e, d, h, generator=g) * 0.2,
        torch.randn(e, d, h, generator=g) * 0.2,
        torch.randn(e, h, d, generator=g) * 0.2,
    ]
    return x, gates, indices, weights


@pytest.mark.parametrize("routing", ["random", "one-expert"])
@pytest.mark.parametrize("n", [1, 7, 96])
def test_padded_equals_loop_forward_and_backward(routing, n):
    """fp32 on the CPU, equal up to summation order: a 1-row segment takes a
    matrix-vector kernel in the loop, and the weight gradient adds block products
    in another order than one mm per expert (the 96-row forward is bit-equal)."""
    results = {}
    for backend in ("loop", "padded"):
        x, gates, indices, weights = _moe_inputs(n=n, routing=routing)
        leaves = [
            x.requires_grad_(),
            gates.requires_grad_(),
            *(w.requires_grad_() for w in weights),
        ]
        y = experts_swiglu(x, gates, indices, *weights, backend=backend)
        grads = torch.autograd.grad(y.square().sum(), leaves)
        results[backend] = (y, grads)
    y_loop, g_loop = results["loop"]
    y_pad, g_pad = results["padded"]
    torch.testing.assert_close(y_pad, y_loop, rtol=1e-6, atol=1e-6)
    if n == 96:
        assert torch.equal(y_pad, y_loop)
    for a, b in zip(g_pad, g_loop, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_padded_and_grouped_paths_make_no_host_sync_and_the_loop_does():
    x, gates, indices, weights = _moe_inputs()
    for backend, expected in (("padded", 0), ("grouped_mm", 0), ("loop", 3)):
        with count_syncs() as syncs:
            y = experts_swiglu(x, gates, indices, *(w.requires_grad_() for w in weights), backend)
            y.sum().backward()
        assert syncs.total == expected, (backend, syncs.report())


def test_moe_layer_padded_backend_matches_loop_layer():
    torch.manual_seed(0)
    layers = {b: MoELayer(16, 8, 2, 24, backend=b) for b in ("loop", "padded")}
    for layer in layers.values():
        torch.manual_seed(1)
        for p in layer.parameters():
            torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(2, 9, 16)
    y_loop, _ = layers["loop"](x)
    y_pad, _ = layers["padded"](x)
    torch.testing.assert_close(y_pad, y_loop, rtol=1e-6, atol=1e-6)


def test_dispatch_from_indices_counts_without_bincount():
    indices = torch.tensor([[1, 2], [2, 0], [2, 1]])
    with count_syncs() as syncs:
        d = Dispatch.from_indices(indices, 4)
    assert syncs.total == 0
    assert d.counts.tolist() == [1, 2, 3, 0]
    assert d.offsets.tolist() == [1, 3, 6, 6]
