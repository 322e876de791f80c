"""algorithm.behavior_logprobs: which log-probs the ratio divides by, checked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tests.trainer.conftest import left_padded_batch
from trainer import metric_keys as K
from trainer.config import ExperimentConfig
from trainer.model import TransformerLM
from trainer.rollout import RolloutEngine
from trainer.rollout.data import RolloutData
from trainer.run.measure_step import measure_batch
from trainer.run.update import PolicyUpdater, behavior_logp

VOCAB = 24


def one_minibatch_update(algorithm: str, behavior: str, shift: float) -> dict:
    """One update of one minibatch on a real engine rollout whose log-probs are shifted.

    The rollout log-probs are set to the training log-probs minus ``shift`` on
    every response token, so pi_theta / pi_rollout = e^shift exactly on the
    first (only) minibatch, before any optimiser step.
    """
    cfg = ExperimentConfig.model_validate(
        {
            "model": {"n_layers": 1, "d_model": 32, "n_heads": 4, "n_experts": 4, "top_k": 2,
                      "expert_hidden": 16, "max_seq_len": 32},
            "rollout": {"group_size": 4, "precision": "fp32"},
            "algorithm": {"name": algorithm, "minibatches": 1, "kl_coef": 0.0,
                          "behavior_logprobs": behavior},
        }
    )  # fmt: skip
    torch.manual_seed(0)
    policy = TransformerLM(cfg.model, VOCAB, value_head=cfg.algorithm.spec.has_value_head)
    updater = PolicyUpdater(cfg, policy, None, torch.Generator().manual_seed(1))
    engine = RolloutEngine(cfg.model, VOCAB, precision="fp32")
    engine.load_weights(policy.state_dict())
    prompts, mask = left_padded_batch(VOCAB, [6, 5, 4, 3] * 2, 6, seed=1)
    rollout = engine.generate(prompts, mask, 4, generator=torch.Generator().manual_seed(2))
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])
    data = RolloutData.from_rollout(rollout, rewards)
    updater.stabilizers.begin_step(data, 0)
    measure_batch(cfg, policy, updater, data)
    data.rollout_logp = torch.where(data.response_mask, data.old_logp - shift, data.rollout_logp)
    return updater.update(data, 0, lr=0.0, entropy_coef=0.0)


def test_behavior_logp_picks_the_denominator():
    data = RolloutData(
        tokens=torch.zeros(1, 2, dtype=torch.long),
        attention_mask=torch.ones(1, 2, dtype=torch.bool),
        response_mask=torch.ones(1, 2, dtype=torch.bool),
        rollout_logp=torch.tensor([[-1.0, -2.0]]),
        rewards=torch.zeros(1),
        rollout_routing=None,
        routing_mask=None,
        old_logp=torch.tensor([[-1.5, -2.5]]),
    )
    assert behavior_logp(data, "train") is data.old_logp
    assert behavior_logp(data, "rollout") is data.rollout_logp


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_token_ratio_is_one_with_train_and_e_to_the_gap_with_rollout(algorithm):
    shift = 0.1  # ratio e^0.1 = 1.105: inside the 0.2 clip, so nothing is clipped
    train = one_minibatch_update(algorithm, "train", shift)
    assert train[K.POLICY_RATIO_MAX] == pytest.approx(1.0, abs=1e-6)
    assert train[K.POLICY_CLIP_FRAC] == 0.0
    rollout = one_minibatch_update(algorithm, "rollout", shift)
    assert rollout[K.POLICY_RATIO_MAX] == pytest.approx(math.exp(shift), rel=1e-5)
    assert rollout[K.POLICY_CLIP_FRAC] == 0.0
    # e^0.5 = 1.65 lies outside [0.8, 1.2]: clipped wherever the advantage is positive.
    assert one_minibatch_update(algorithm, "rollout", 0.5)[K.POLICY_CLIP_FRAC] > 0.0


def test_gspo_sequence_ratio_follows_the_behaviour_policy():
    # GSPO's ratio is the geometric mean over the sequence: exp(mean log-ratio) = e^shift.
    shift = 2e-4  # inside GSPO's (3e-4, 4e-4) clip range
    assert one_minibatch_update("gspo", "train", shift)[K.POLICY_RATIO_MAX] == pytest.approx(
        1.0, abs=1e-6
    )
    rollout = one_minibatch_update("gspo", "rollout", shift)
    assert rollout[K.POLICY_RATIO_MAX] == pytest.approx(math.exp(shift), rel=1e-6)
