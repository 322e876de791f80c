"""Advantages against hand-computed values."""

import pytest
import torch

from trainer.algorithms.advantages import (
    RewardNormalizer,
    dominant_expert,
    expert_zscore_advantages,
    gae,
    grpo_advantages,
)

torch.set_num_threads(1)


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(actual, torch.tensor(expected), atol=tol, rtol=0)


# --------------------------------------------------------------------------- GRPO
def test_grpo_two_groups_of_four():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv = grpo_advantages(rewards, group_size=4)
    # group 0: mean 0.5, population std 0.5 -> (+-0.5) / (0.5 + 1e-6) = +-0.999998
    # group 1: all equal -> 0
    close(adv, [0.999998, -0.999998, -0.999998, 0.999998, 0, 0, 0, 0])


def test_grpo_without_std_only_centres():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0])
    adv = grpo_advantages(rewards, group_size=3, std_normalize=False)
    # group means 1/3 and 5/3
    close(adv, [0.666667, -0.333333, -0.333333, -0.666667, 1.333333, -0.666667])


def test_grpo_rejects_ragged_groups():
    with pytest.raises(ValueError):
        grpo_advantages(torch.zeros(5), group_size=4)


# --------------------------------------------------------------------------- EMA normaliser
def test_reward_normalizer_ema_moments_and_resume():
    norm = RewardNormalizer(decay=0.5, eps=0.0)
    norm.update(torch.tensor([1.0, 3.0]))  # first batch: mean 2, E[r^2] 5 -> var 1
    assert norm.mean == pytest.approx(2.0)
    assert norm.std == pytest.approx(1.0)
    norm.update(torch.tensor([0.0, 0.0]))  # mean .5*2+.5*0 = 1, E[r^2] .5*5 = 2.5 -> var 1.5
    assert norm.mean == pytest.approx(1.0)
    assert norm.std == pytest.approx(1.5**0.5)
    # (1 - 1) / 1.224745 = 0, (4 - 1) / 1.224745 = 2.449490
    close(norm.normalize(torch.tensor([1.0, 4.0])), [0.0, 2.449490])

    restored = RewardNormalizer()
    restored.load_state_dict(norm.state_dict())
    close(restored.normalize(torch.tensor([1.0, 4.0])), [0.0, 2.449490])


def test_reward_normalizer_identity_before_first_update():
    close(RewardNormalizer(eps=0.0).normalize(torch.tensor([0.5, 2.0])), [0.5, 2.0])


# --------------------------------------------------------------------------- expert z-score
def test_dominant_expert_counts_all_slots_over_masked_tokens_ties_to_lowest():
    indices = torch.tensor(
        [
            [[0, 1], [1, 2], [1, 3]],  # expert 1 three times
            [[2, 3], [3, 2], [0, 1]],  # 2 and 3 twice each (third token masked) -> tie -> 2
            [[3, 0], [3, 1], [0, 3]],  # token 0 masked: 3 twice, 0 once, 1 once -> 3
        ]
    )
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    assert dominant_expert(indices, mask, n_experts=4).tolist() == [1, 2, 3]


def test_expert_zscore_within_groups():
    adv = torch.tensor([1.0, 4.0, 3.0, 9.0, 6.0, 2.0])
    groups = torch.tensor([2, 0, 2, 5, 0, 2])
    z = expert_zscore_advantages(adv, groups, eps=0.0)
    # group 2: [1, 3, 2] mean 2, std sqrt(2/3) = 0.816497 -> [-1.224745, 1.224745, 0]
    # group 0: [4, 6] mean 5, std 1 -> [-1, 1]; group 5 has one member -> 0
    close(z, [-1.224745, -1.0, 1.224745, 0.0, 1.0, 0.0])


def test_expert_zscore_equal_advantages_give_zero():
    z = expert_zscore_advantages(torch.tensor([0.3, 0.3]), torch.tensor([1, 1]))
    close(z, [0.0, 0.0])


# --------------------------------------------------------------------------- GAE
def test_gae_three_step_response():
    # layout: [prompt | 3 response tokens | pad]; garbage where the mask is off
    mask = torch.tensor([[0, 1, 1, 1, 0]], dtype=torch.bool)
    values = torch.tensor([[9.0, 0.5, 0.6, 0.7, 9.0]])
    rewards = torch.tensor([[5.0, 0.0, 0.0, 1.0, 5.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # delta_3 = 1 + 0.9*0 - 0.7 = 0.3 ; delta_2 = 0.9*0.7 - 0.6 = 0.03 ; delta_1 = 0.9*0.6 - 0.5 = 0.04
    # A_3 = 0.3 ; A_2 = 0.03 + 0.72*0.3 = 0.246 ; A_1 = 0.04 + 0.72*0.246 = 0.21712
    close(adv, [[0.0, 0.21712, 0.246, 0.3, 0.0]])
    close(ret, [[0.0, 0.71712, 0.846, 1.0, 0.0]])


def _gae_reference_loop(rewards, values, mask, gamma, lam):
    """Textbook backward recursion, one position at a time (test oracle only)."""
    m = mask.float()
    adv = torch.zeros_like(rewards)
    next_adv = torch.zeros(rewards.shape[0])
    next_value = torch.zeros(rewards.shape[0])
    next_mask = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value * next_mask - values[:, t]
        a = delta + gamma * lam * next_mask * next_adv
        adv[:, t] = a * m[:, t]
        next_adv, next_value, next_mask = adv[:, t], values[:, t], m[:, t]
    return adv


def test_gae_blocks_match_the_recursion_across_block_boundaries():
    g = torch.Generator().manual_seed(0)
    bsz, t_len = 4, 150
    starts = torch.tensor([3, 10, 60, 0])
    ends = torch.tensor([140, 70, 64, 150])
    pos = torch.arange(t_len)
    mask = (pos >= starts[:, None]) & (pos < ends[:, None])
    values = torch.randn(bsz, t_len, generator=g) * mask
    rewards = torch.zeros(bsz, t_len)
    rewards[torch.arange(bsz), ends - 1] = torch.tensor([1.0, 0.0, 1.0, 0.5])
    adv, _ = gae(rewards, values, mask, gamma=0.99, lam=0.95, block=16)
    expected = _gae_reference_loop(rewards, values, mask, 0.99, 0.95)
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


def test_gae_lambda_zero_is_one_step_td():
    mask = torch.tensor([[1, 1]], dtype=torch.bool)
    adv, _ = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.2, 0.4]]), mask, gamma=1.0, lam=0.0)
    # A_0 = 0 + 0.4 - 0.2 = 0.2 ; A_1 = 1 - 0.4 = 0.6
    close(adv, [[0.2, 0.6]])


@pytest.mark.parametrize("group_size", [3, 7, 8, 12, 16])
@pytest.mark.parametrize("value", [0.7, 0.1, 0.3, 1 / 3, 0.9, -2.5, 1e3 + 0.3])
def test_equal_non_binary_rewards_give_exactly_zero(group_size, value):
    """fp32 rounding of the mean used to leave residues that a tiny std blew up
    (a group of eight 0.7s got +0.056 each)."""
    equal = [value] * group_size
    other = [float(i % 2) for i in range(group_size)]
    adv = grpo_advantages(torch.tensor(equal + other, dtype=torch.float32), group_size)
    assert torch.equal(adv[:group_size], torch.zeros(group_size))
    assert adv[group_size:].abs().sum() > 0


def test_ema_normalised_equal_groups_give_exactly_zero():
    """The EMA-normalised path (preset moe-grpo-ema-adv) over 500 simulated
    all-equal groups: every advantage is exactly 0."""
    gen = torch.Generator().manual_seed(0)
    normalizer = RewardNormalizer(decay=0.9)
    for _ in range(500):
        value = torch.rand((), generator=gen).item()
        rewards = torch.full((8,), value)
        normalizer.update(rewards)
        adv = grpo_advantages(normalizer.normalize(rewards), group_size=8)
        assert torch.equal(adv, torch.zeros(8))


def test_expert_zscore_equal_non_binary_advantages_give_exactly_zero():
    adv = torch.tensor([0.7] * 8 + [0.3, 0.9])
    groups = torch.tensor([1] * 8 + [2, 2])
    z = expert_zscore_advantages(adv, groups)
    assert torch.equal(z[:8], torch.zeros(8))
    assert z[8] < 0 < z[9]
