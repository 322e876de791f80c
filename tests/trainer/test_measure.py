"""Mismatch and expert metrics against hand-computed values."""

import math

import pytest
import torch

from trainer import metric_keys as mk
from trainer.algorithms.measure import (
    estimator_stats,
    expert_load,
    expert_stats,
    max_violation,
    mismatch_stats,
    router_entropy,
    routing_mismatch,
    utilization,
)

torch.set_num_threads(1)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


def test_mismatch_k1_k3_extreme_and_max():
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.3, 0.0]])
    log_r = torch.tensor([[0.1, -0.2, 0.8], [0.0, -0.9, 50.0]])  # the pad's 50 must not count
    stats = mismatch_stats(rollout + log_r, rollout, MASK)
    # k1 = -(0.1 - 0.2 + 0.8 + 0 - 0.9) / 5 = 0.04
    assert stats[mk.MISMATCH_KL_K1] == pytest.approx(0.04, abs=1e-6)
    # k3 per token = e^x - 1 - x: .0051709, .0187308, .4255409, 0, .3065697 ; sum .7560123
    assert stats[mk.MISMATCH_KL_K3] == pytest.approx(0.7560123 / 5, abs=1e-6)
    # |log r| > ln 2 = .6931 for 0.8 and -0.9
    assert stats[mk.MISMATCH_EXTREME_TOKEN_FRAC] == pytest.approx(0.4)
    # per-sequence k3: (.0051709 + .0187308 + .4255409)/3 = .1498142 ; .3065697/2 = .1532848
    assert stats[mk.MISMATCH_KL_K3_MAX] == pytest.approx(0.1532848, abs=1e-6)


def test_mismatch_identical_policies_is_zero():
    logp = torch.randn(2, 3)
    stats = mismatch_stats(logp, logp.clone(), MASK)
    assert all(v == 0.0 for v in stats.values())


def _routings():
    # 2 sequences x 3 tokens, top-2, 2 MoE layers; token 2 of sequence 1 is padding
    a0 = torch.tensor([[[0, 1], [2, 3], [4, 5]], [[1, 2], [3, 0], [7, 7]]])
    b0 = torch.tensor([[[1, 0], [2, 4], [4, 5]], [[1, 2], [3, 0], [0, 1]]])
    #                   same set  differs  same        same     same    (pad)
    a1 = torch.tensor([[[0, 1], [0, 1], [0, 1]], [[5, 6], [5, 6], [5, 6]]])
    b1 = torch.tensor([[[0, 1], [0, 2], [1, 0]], [[5, 6], [6, 7], [5, 6]]])
    #                   same     differs  same      same     differs  same
    return [a0, a1], [b0, b1]


def test_routing_inconsistency_sdi_and_any_layer():
    a, b = _routings()
    stats = routing_mismatch(a, b, MASK)
    # (token, layer) pairs: 5 masked tokens x 2 layers = 10 ; differing: L0 s0t1, L1 s0t1, L1 s1t1
    assert stats[mk.MISMATCH_ROUTING_INCONSISTENCY] == pytest.approx(3 / 10)
    # tokens differing in any layer: s0t1, s1t1 -> 2 of 5
    assert stats[mk.MISMATCH_TOKEN_ANY_LAYER_FRAC] == pytest.approx(2 / 5)
    # SDI: seq 0 1/3, seq 1 1/2 -> mean 5/12
    assert stats[mk.MISMATCH_SDI] == pytest.approx(5 / 12)


def test_same_set_in_another_order_is_not_a_mismatch():
    a = [torch.tensor([[[0, 3], [2, 1]]]), torch.tensor([[[7, 5], [4, 6]]])]
    b = [torch.tensor([[[3, 0], [1, 2]]], dtype=torch.uint8), torch.tensor([[[5, 7], [6, 4]]])]
    stats = routing_mismatch(a, b, torch.ones(1, 2, dtype=torch.bool))
    assert stats == {
        mk.MISMATCH_ROUTING_INCONSISTENCY: 0.0,
        mk.MISMATCH_TOKEN_ANY_LAYER_FRAC: 0.0,
        mk.MISMATCH_SDI: 0.0,
    }


def test_expert_load_and_max_violation():
    # masked tokens route (0,1), (0,2), (0,3), (0,1) -> counts [4, 2, 1, 1]; the pad's (3,3) is ignored
    indices = torch.tensor([[[0, 1], [0, 2], [0, 3]], [[1, 0], [3, 3], [2, 2]]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    load = expert_load(indices, mask, n_experts=4)
    torch.testing.assert_close(load, torch.tensor([0.5, 0.25, 0.125, 0.125]))
    # MaxVio = max load * E / sum - 1 = 0.5 * 4 / 1 - 1 = 1
    assert max_violation(load) == pytest.approx(1.0)
    assert max_violation(torch.tensor([4.0, 2.0, 1.0, 1.0])) == pytest.approx(
        1.0
    )  # counts work too
    assert max_violation(torch.tensor([3.0, 3.0, 3.0])) == pytest.approx(0.0)


def test_utilization_counts_experts_with_half_their_fair_share():
    # E = 4: fair share .25, half of it .125
    assert utilization(torch.tensor([0.5, 0.25, 0.125, 0.125])) == pytest.approx(1.0)
    assert utilization(torch.tensor([5.0, 2.0, 1.0, 0.0])) == pytest.approx(0.75)
    assert utilization(torch.tensor([10.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)


def test_router_entropy():
    probs = torch.tensor([[[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]]])
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    # ln 2 = .693147 and 0 -> mean .346574
    assert router_entropy(probs, mask) == pytest.approx(0.3465736, abs=1e-6)


class _Routing:
    def __init__(self, probs, used_indices):
        self.probs, self.used_indices = probs, used_indices


def test_expert_stats_per_layer_and_means():
    mask = torch.ones(1, 2, dtype=torch.bool)
    uniform = torch.full((1, 2, 2), 0.5)
    peaked = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    layers = [
        _Routing(uniform, torch.tensor([[[0], [1]]])),  # load [.5, .5]: MaxVio 0, util 1
        _Routing(peaked, torch.tensor([[[0], [0]]])),  # load [1, 0]: MaxVio 1, util .5
    ]
    stats = expert_stats(layers, mask, n_experts=2)
    assert stats[mk.experts_load(0)] == [0.5, 0.5]
    assert stats[mk.experts_load(1)] == [1.0, 0.0]
    assert stats[mk.EXPERTS_MAX_VIOLATION] == pytest.approx(0.5)
    assert stats[mk.EXPERTS_UTILIZATION] == pytest.approx(0.75)
    assert stats[mk.EXPERTS_ROUTER_ENTROPY] == pytest.approx(math.log(2) / 2)
    bare = expert_stats([torch.tensor([[[0], [1]]])], mask, n_experts=2)
    assert mk.EXPERTS_ROUTER_ENTROPY not in bare
    assert bare[mk.EXPERTS_MAX_VIOLATION] == 0.0


def test_expert_load_keys_name_the_models_blocks():
    """A model with a dense first block (DeepSeek's first_k_dense_replace) logs its two
    routed blocks as L1 and L2, as the dashboards and the tracking API read them."""
    mask = torch.ones(1, 2, dtype=torch.bool)
    layers = [torch.tensor([[[0], [1]]]), torch.tensor([[[1], [1]]])]
    stats = expert_stats(layers, mask, n_experts=2, layer_ids=[1, 2])
    assert stats[mk.experts_load(1)] == [0.5, 0.5] and stats[mk.experts_load(2)] == [0.0, 1.0]
    assert mk.experts_load(0) not in stats
    with pytest.raises(ValueError, match="layer ids"):
        expert_stats(layers, mask, n_experts=2, layer_ids=[1])


def test_estimator_chi_square_ess_and_sequence_log_ratios_by_hand():
    # rho = pi_old / pi_rollout: sequence 1 has tokens with rho 2 and 1, sequence 2
    # one token with rho 0.5 (the padded slot is masked out).
    old = torch.tensor([[math.log(2.0), 0.0], [math.log(0.5), 5.0]])
    rollout = torch.zeros(2, 2)
    mask = torch.tensor([[True, True], [True, False]])
    means, largest = estimator_stats(old, rollout, mask)
    # token: mean rho^2 = (4 + 1 + 0.25) / 3; ESS = 3.5^2 / (3 * 5.25)
    assert means[mk.IS_CHI2_TOKEN] == pytest.approx(5.25 / 3 - 1)
    assert means[mk.IS_ESS_TOKEN] == pytest.approx(12.25 / 15.75)
    # sequence: w = (2, 0.5); mean w^2 = 2.125; ESS = 2.5^2 / (2 * 4.25)
    assert means[mk.IS_CHI2_SEQ] == pytest.approx(1.125)
    assert means[mk.IS_ESS_SEQ] == pytest.approx(6.25 / 8.5)
    assert means[mk.IS_SEQ_LOG_RATIO_MEAN] == pytest.approx(0.0, abs=1e-12)
    assert means[mk.IS_SEQ_LOG_RATIO_ABS] == pytest.approx(math.log(2.0))
    assert largest == pytest.approx(math.log(2.0))


def test_estimator_of_identical_policies_is_perfect():
    lp = torch.randn(3, 5)
    means, largest = estimator_stats(lp, lp, torch.ones(3, 5, dtype=torch.bool))
    assert means[mk.IS_CHI2_TOKEN] == 0 and means[mk.IS_CHI2_SEQ] == 0
    assert means[mk.IS_ESS_TOKEN] == 1 and means[mk.IS_ESS_SEQ] == 1
    assert largest == 0
