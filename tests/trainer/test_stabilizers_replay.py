"""Routing replay: warm-up schedule, compact storage, router-anchoring KL."""

import math

import pytest
import torch
import torch.nn.functional as F

from trainer.rollout.routing_pack import (
    combination_bound_bits,
    index_bits,
    pack_routing,
    storage_report,
    unpack_routing,
)
from trainer.stabilizers.replay import (
    RouterAnchor,
    own_choice_share,
    replay_keep_mask,
    replayed_fraction,
)

torch.set_num_threads(1)


# --------------------------------------------------------------------------- warm-up schedule
def test_own_choice_share_shrinks_linearly():
    assert own_choice_share(0, 10, 0.1) == pytest.approx(0.1)
    assert own_choice_share(5, 10, 0.1) == pytest.approx(0.05)
    assert own_choice_share(9, 10, 0.1) == pytest.approx(0.01)
    assert own_choice_share(10, 10, 0.1) == 0.0
    assert own_choice_share(500, 10, 0.1) == 0.0
    assert own_choice_share(0, 0, 0.1) == 0.0  # no warm-up: replay from the start


def test_keep_mask_shares_follow_the_schedule():
    g = torch.Generator().manual_seed(0)
    shape, layers = (64, 128), 4  # 32768 pairs: binomial std at p=0.5 is 0.0028
    for step, expected_replay in ((0, 0.5), (50, 0.75)):
        masks = replay_keep_mask(shape, layers, step, 100, 0.5, g)
        assert len(masks) == layers and masks[0].shape == shape and masks[0].dtype == torch.bool
        assert replayed_fraction(masks) == pytest.approx(expected_replay, abs=0.015)


def test_keep_mask_exact_at_the_ends():
    g = torch.Generator().manual_seed(1)
    after = replay_keep_mask((3, 5), 2, 100, 100, 0.5, g)
    assert all(m.all() for m in after) and replayed_fraction(after) == 1.0
    everyone_keeps = replay_keep_mask((3, 5), 2, 0, 100, 1.0, g)
    assert not any(m.any() for m in everyone_keeps) and replayed_fraction(everyone_keeps) == 0.0
    assert all(m.all() for m in replay_keep_mask((3, 5), 2, 0, 100, 0.0, g))


def test_keep_mask_is_deterministic_given_the_seed():
    a = replay_keep_mask((4, 6), 3, 2, 10, 0.3, torch.Generator().manual_seed(7))
    b = replay_keep_mask((4, 6), 3, 2, 10, 0.3, torch.Generator().manual_seed(7))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_replayed_fraction_counts_only_masked_tokens():
    masks = [torch.tensor([[True, False, True]]), torch.tensor([[True, True, False]])]
    assert replayed_fraction(masks) == pytest.approx(4 / 6)
    token_mask = torch.tensor([[True, True, False]])
    assert replayed_fraction(masks, token_mask) == pytest.approx(3 / 4)


# --------------------------------------------------------------------------- storage
@pytest.mark.parametrize("compression", ["none", "rle", "zlib"])
@pytest.mark.parametrize("n_experts", [8, 16, 32, 64, 256])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_pack_round_trip(n_experts, k, compression):
    g = torch.Generator().manual_seed(n_experts * 10 + k)
    layers = [torch.rand(3, 7, n_experts, generator=g).topk(k).indices for _ in range(3)]
    layers[1][:, 2:5] = layers[1][:, 1:2]  # a few runs for the run-length code
    packed = pack_routing(layers, n_experts, compression)
    back = unpack_routing(packed)
    assert all(torch.equal(a, b) for a, b in zip(layers, back, strict=True))
    if compression == "none":
        assert packed.nbytes == math.ceil(3 * 3 * 7 * k * index_bits(n_experts) / 8)


def test_sixteen_experts_top2_is_one_byte_per_token_layer():
    idx = torch.tensor([[[3, 10], [15, 0]]])  # (B=1, T=2, k=2)
    packed = pack_routing([idx, idx.flip(-1)], 16)
    assert packed.bytes_per_token_layer == 1.0
    # 4 bits per index, big-endian: [3, 10] -> 0x3A, [15, 0] -> 0xF0, then layer 2 flipped
    assert packed.data.tolist() == [0x3A, 0xF0, 0xA3, 0x0F]


def test_bits_cross_byte_boundaries():
    # 8 experts = 3 bits: indices 5, 3, 7 -> 101 011 11(1) + 5 zero pad bits
    packed = pack_routing([torch.tensor([[[5], [3], [7]]])], 8)
    assert packed.data.tolist() == [0b10101111, 0b10000000]
    assert packed.bytes_per_token_layer == pytest.approx(2 / 3)


def test_run_length_code_by_hand():
    # 16 experts top-1, tokens 2 2 2 5: runs (2, x3), (5, x1) -> values 0x25, counts 3, 1
    packed = pack_routing([torch.tensor([[[2], [2], [2], [5]]])], 16, "rle")
    assert packed.n_runs == 2
    assert packed.data.tolist() == [0x25, 3, 1]


def test_long_runs_split_at_255():
    idx = torch.zeros(1, 600, 2, dtype=torch.long)
    packed = pack_routing([idx], 16, "rle")
    assert packed.n_runs == 3  # 255 + 255 + 90
    assert packed.data[-3:].tolist() == [255, 255, 90]
    assert torch.equal(unpack_routing(packed)[0], idx)


def test_constant_routing_compresses_below_the_bound():
    idx = torch.tensor([1, 4]).expand(8, 64, 2).contiguous()
    for compression in ("rle", "zlib"):
        report = storage_report(pack_routing([idx] * 4, 16, compression))
        assert report["bits_per_token_layer"] < report["bound_bits"]


def test_combination_bound_by_hand():
    assert combination_bound_bits(16, 2) == pytest.approx(math.log2(120))  # 6.9069
    assert combination_bound_bits(16, 2) == pytest.approx(6.906891, abs=1e-6)
    assert combination_bound_bits(8, 1) == pytest.approx(3.0)
    assert combination_bound_bits(64, 4) == pytest.approx(math.log2(635376))  # 19.277
    report = storage_report(pack_routing([torch.tensor([[[3, 10]]])], 16))
    assert report["bits_per_token_layer"] == 8.0 and report["fixed_width_bits"] == 8.0
    assert report["ratio_to_bound"] == pytest.approx(8 / math.log2(120))


def test_pack_rejects_out_of_range_ids():
    with pytest.raises(ValueError):
        pack_routing([torch.tensor([[[16]]])], 16)


# --------------------------------------------------------------------------- router anchor
def test_anchor_kl_direction_by_hand():
    anchor = RouterAnchor(buffer_steps=2)
    anchor.add(0, torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    current = torch.tensor([[0.9, 0.1], [0.7, 0.3]], requires_grad=True)  # marginal (.8, .2)
    loss = anchor.loss(current)
    # KL(q || p) = .5 ln(.5/.8) + .5 ln(.5/.2) = 0.223144; the reverse would be 0.192745
    assert loss.item() == pytest.approx(0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2))
    p, q = torch.tensor([0.8, 0.2]), torch.tensor([0.5, 0.5])
    assert loss.item() == pytest.approx(F.kl_div(p.log(), q, reduction="sum").item())
    loss.backward()
    # d/dp_{n,e} = -q_e / (p_e * N): (-.5/.8/2, -.5/.2/2)
    torch.testing.assert_close(current.grad, torch.tensor([[-0.3125, -1.25]] * 2))


def test_anchor_is_zero_on_its_own_distribution_and_empty():
    anchor = RouterAnchor(buffer_steps=3)
    probs = torch.tensor([[0.2, 0.3, 0.5], [0.4, 0.4, 0.2]])
    assert anchor.loss(probs).item() == 0.0
    anchor.add(0, probs)
    assert anchor.loss(probs).item() == pytest.approx(0.0, abs=1e-7)


def test_anchor_buffer_is_bounded_and_merges_minibatches():
    anchor = RouterAnchor(buffer_steps=2)
    anchor.add(0, torch.tensor([[1.0, 0.0]]))
    anchor.add(1, torch.tensor([[0.0, 1.0]]))
    anchor.add(1, torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]))  # step 1 again: 4 tokens
    anchor.add(2, torch.tensor([[0.5, 0.5]]))
    assert len(anchor) == 2  # step 0 dropped
    # step 1 marginal (2/4, 2/4); step 2 (.5, .5) -> anchor (.5, .5)
    torch.testing.assert_close(anchor.anchor(), torch.tensor([[0.5, 0.5]]))
    anchor.add(3, torch.tensor([[0.9, 0.1]]))
    torch.testing.assert_close(anchor.anchor(), torch.tensor([[0.7, 0.3]]))


def test_anchor_layers_and_mask():
    anchor = RouterAnchor(buffer_steps=4)
    recorded = torch.tensor([[[0.5, 0.5], [0.1, 0.9]], [[0.25, 0.75], [0.25, 0.75]]])  # (L=2,N=2,E)
    anchor.add(0, recorded, mask=torch.tensor([True, False]))
    torch.testing.assert_close(anchor.anchor(), torch.tensor([[0.5, 0.5], [0.25, 0.75]]))
    current = torch.tensor([[[0.5, 0.5]], [[0.5, 0.5]]])
    expected = 0.5 * (0.0 + 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5))
    assert anchor.loss(current).item() == pytest.approx(expected)


def test_anchor_state_round_trip():
    anchor = RouterAnchor(buffer_steps=3)
    anchor.add(4, torch.tensor([[0.6, 0.4]]))
    anchor.add(5, torch.tensor([[0.2, 0.8]]))
    restored = RouterAnchor(buffer_steps=1)
    restored.load_state_dict(anchor.state_dict())
    assert restored.buffer_steps == 3 and len(restored) == 2
    torch.testing.assert_close(restored.anchor(), anchor.anchor())
    restored.add(6, torch.tensor([[0.5, 0.5]]))
    anchor.add(6, torch.tensor([[0.5, 0.5]]))
    torch.testing.assert_close(restored.anchor(), anchor.anchor())
