"""Importance-sampling corrections against hand-computed weights."""

import math

import pytest
import torch

from trainer.algorithms.is_correction import is_weights

torch.set_num_threads(1)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


def _logps():
    # r = pi_train_old / pi_rollout: seq 0 [3, 0.25, 1.5], seq 1 [4, 2, pad]
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]])
    ratios = torch.tensor([[3.0, 0.25, 1.5], [4.0, 2.0, 100.0]])
    return rollout + ratios.log(), rollout


def test_none_is_the_mask():
    w, stats = is_weights(*_logps(), MASK, mode="none")
    torch.testing.assert_close(w, MASK.float())
    assert stats.ratio_mean == pytest.approx((3 + 0.25 + 1.5 + 4 + 2) / 5, abs=1e-5)  # 2.15
    assert stats.ratio_max == pytest.approx(4.0, abs=1e-5)


def test_tis_truncates_at_cap():
    w, stats = is_weights(*_logps(), MASK, mode="tis", tis_cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.25, 1.5], [2.0, 2.0, 0.0]]))
    assert stats.clip_frac == pytest.approx(2 / 5)  # 3 and 4 exceed 2; r = 2 does not
    assert stats.masked_frac == 0.0
    assert not w.requires_grad


def test_mis_drops_sequences_by_geometric_mean():
    train, rollout = _logps()
    w, stats = is_weights(train, rollout, MASK, mode="mis", mis_low=0.5, mis_high=2.0)
    # geometric means: (3 * .25 * 1.5)^(1/3) = 1.040042 (kept) ; (4 * 2)^(1/2) = 2.828427 (dropped)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert stats.masked_frac == pytest.approx(2 / 5)
    w, _ = is_weights(train, rollout, MASK, mode="mis", mis_low=0.5, mis_high=math.sqrt(8) + 1e-3)
    torch.testing.assert_close(w, MASK.float())


def test_icepop_zeroes_tokens_outside_band():
    w, stats = is_weights(*_logps(), MASK, mode="icepop", icepop_low=0.5, icepop_high=5.0)
    torch.testing.assert_close(
        w, torch.tensor([[3.0, 0.0, 1.5], [4.0, 2.0, 0.0]]), atol=1e-5, rtol=0
    )
    assert stats.masked_frac == pytest.approx(1 / 5)


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError):
        is_weights(*_logps(), MASK, mode="bogus")
