"""Policy, value, KL, entropy and log-prob formulas against hand-computed values."""

import math

import pytest
import torch

from trainer.algorithms.losses import (
    aggregate,
    clipped_policy_loss,
    entropy_from_logits,
    gather_logprobs,
    gspo_policy_loss,
    kl_k3,
    masked_mean,
    value_loss,
)

torch.set_num_threads(1)
LN = math.log


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(actual, torch.tensor(expected), atol=tol, rtol=0)


MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


def test_masked_mean_and_aggregation():
    x = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, float("nan")]])
    close(masked_mean(x, MASK), 36.0 / 5)  # nan in the pad never leaks
    close(masked_mean(x, MASK, dim=1), [2.0, 15.0])
    close(aggregate(x, MASK, "token_mean"), 7.2)
    close(aggregate(x, MASK, "seq_mean"), (2.0 + 15.0) / 2)
    # a row without tokens does not count as a sequence
    empty = torch.tensor([[1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    close(aggregate(x, empty, "seq_mean"), 2.0)


# --------------------------------------------------------------------------- PPO / GRPO clip
def _clip_example():
    # ratios: seq 0 [1.5, 0.7, 1.0] with A = +1 ; seq 1 [0.5, 1.3, pad] with A = -2
    old = torch.zeros(2, 3)
    logp = torch.tensor([[LN(1.5), LN(0.7), 0.0], [LN(0.5), LN(1.3), 7.0]], requires_grad=True)
    adv = torch.tensor([1.0, -2.0])
    return logp, old, adv


def test_clipped_policy_loss_token_mean_and_stats():
    logp, old, adv = _clip_example()
    loss, stats = clipped_policy_loss(logp, old, adv, MASK, 0.2, 0.2, "token_mean")
    # objective min(rA, clip(r)A): seq0: min(1.5,1.2)=1.2 (clipped), min(.7,.8)=.7, 1.0
    #                              seq1: min(-1,-1.6)=-1.6 (clipped), min(-2.6,-2.4)=-2.6
    # loss = -(1.2 + .7 + 1 - 1.6 - 2.6) / 5 = 1.3 / 5
    close(loss, 0.26)
    assert stats.clip_frac == pytest.approx(2 / 5)
    assert stats.ratio_max == pytest.approx(1.5)
    assert stats.ratio_mean == pytest.approx(1.0)  # (1.5+.7+1+.5+1.3)/5
    # k3 = r-1-ln r: .094535 + .056675 + 0 + .193147 + .037636 = .381993 -> /5
    assert stats.approx_kl == pytest.approx(0.0763986, abs=1e-6)

    loss.backward()
    # d loss / d logp_t = -A r / 5 where unclipped, 0 where clipped
    close(logp.grad, [[0.0, -0.7 / 5, -1.0 / 5], [0.0, 2 * 1.3 / 5, 0.0]])


def test_clipped_policy_loss_seq_mean_and_token_weights():
    logp, old, adv = _clip_example()
    loss, _ = clipped_policy_loss(logp, old, adv, MASK, 0.2, 0.2, "seq_mean")
    close(loss, ((-1.2 - 0.7 - 1.0) / 3 + (1.6 + 2.6) / 2) / 2)  # 0.566667
    weights = torch.tensor([[1.0, 0.5, 0.0], [2.0, 1.0, 0.0]])
    loss, _ = clipped_policy_loss(logp, old, adv, MASK, 0.2, 0.2, "token_mean", weights)
    close(loss, (-1.2 - 0.35 + 0.0 + 3.2 + 2.6) / 5)  # 0.85


def test_clipped_policy_loss_per_token_advantages():
    logp, old, _ = _clip_example()
    adv_tok = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])
    loss, _ = clipped_policy_loss(logp, old, adv_tok, MASK, 0.2, 0.2)
    close(loss, 0.26)


# --------------------------------------------------------------------------- GSPO
def _gspo_example():
    # token log-ratios: seq 0 [0.1, -0.1, 0.3] (mean 0.1), seq 1 [-0.2, 0.0, pad] (mean -0.1)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, 0.0]])
    delta = torch.tensor([[0.1, -0.1, 0.3], [-0.2, 0.0, 3.0]])
    logp = (old + delta).requires_grad_(True)
    return logp, old, torch.tensor([1.0, -1.0])


def test_gspo_sequence_ratio_loss_and_gradient():
    logp, old, adv = _gspo_example()
    loss, stats = gspo_policy_loss(logp, old, adv, MASK, 0.2, 0.2)
    # s0 = e^0.1 = 1.105171, s1 = e^-0.1 = 0.904837, both inside [0.8, 1.2]
    # loss = mean(-s0*1, -s1*(-1)) = (-1.105171 + 0.904837) / 2
    close(loss, -0.100167)
    assert stats.ratio_max == pytest.approx(1.105171, abs=1e-6)
    assert stats.ratio_mean == pytest.approx((1.105171 + 0.904837) / 2, abs=1e-6)
    assert stats.clip_frac == 0.0
    loss.backward()
    # GSPO-token gradient: -(1/G) A_i s_i (1/|y_i|) per token
    # seq0: -(1/2)(1)(1.105171)(1/3) = -0.184195 ; seq1: -(1/2)(-1)(0.904837)(1/2) = 0.226209
    close(logp.grad, [[-0.184195] * 3, [0.226209, 0.226209, 0.0]])


def test_gspo_paper_clip_range_clips_whole_sequences():
    logp, old, adv = _gspo_example()
    loss, stats = gspo_policy_loss(logp, old, adv, MASK, 3e-4, 4e-4)
    # both sequences leave [0.9997, 1.0004] on the side that clips:
    # seq0: min(1.105171, 1.0004) -> 1.0004 ; seq1 (A=-1): min(-0.904837, -0.9997) = -0.9997
    close(loss, (-1.0004 + 0.9997) / 2)
    assert stats.clip_frac == 1.0
    loss.backward()
    close(logp.grad, torch.zeros(2, 3).tolist())


# --------------------------------------------------------------------------- KL / value / entropy
def test_kl_k3_values():
    logp = torch.tensor([[LN(0.5), LN(0.3)]])
    ref = torch.tensor([[LN(0.25), LN(0.3)]])
    # r = 0.25/0.5 = 0.5 -> 0.5 - 1 + ln 2 = 0.193147 ; equal probs -> 0
    close(kl_k3(logp, ref), [[0.193147, 0.0]])


def test_value_loss_clipped():
    values = torch.tensor([[1.0, 2.0]])
    old = torch.tensor([[0.8, 2.5]])
    returns = torch.tensor([[1.5, 1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    # token 0: (1-1.5)^2 = .25, clipped V = .8+.2 = 1.0 -> .25 ; token 1: (2-1)^2 = 1,
    # clipped V = 2.5-.2 = 2.3 -> 1.69 ; 0.5 * mean(.25, 1.69) = 0.485
    close(value_loss(values, old, returns, mask, clip=0.2), 0.485)
    close(value_loss(values, old, returns, mask, clip=0.0), 0.5 * (0.25 + 1.0) / 2)


def test_entropy_from_logits():
    logits = torch.tensor([[[0.0, 0.0], [0.0, LN(3.0)]]])
    # uniform over 2: ln 2 ; p = (.25, .75): -(.25 ln .25 + .75 ln .75) = 0.562335
    close(entropy_from_logits(logits), [[0.693147, 0.562335]])


def test_gather_logprobs_shifts_by_one():
    logits = torch.tensor([[[0.0, 0.0], [0.0, LN(3.0)], [5.0, -5.0]]], requires_grad=True)
    tokens = torch.tensor([[1, 0, 1]])
    out = gather_logprobs(logits, tokens)
    # pos 0: nothing predicts it -> 0 ; pos 1: token 0 under logits[0] = ln .5 ;
    # pos 2: token 1 under logits[1] = ln .75 ; logits[2] are unused
    close(out, [[0.0, -0.693147, -0.287682]])
    out.sum().backward()
    # d log p_y / d z = onehot(y) - p: row 0 (y=0): [.5, -.5] ; row 1 (y=1): [-.25, .25]
    close(logits.grad, [[[0.5, -0.5], [-0.25, 0.25], [0.0, 0.0]]])
