"""The parallel section's field errors and the single-process arithmetic of
trainer/distributed/ (sharding, loss scales, reductions are identities)."""

from __future__ import annotations

import pytest
import torch

from trainer.distributed import SINGLE, DistContext, DistributedSetupError, init_distributed
from trainer.errors import FieldError
from trainer.validation import validate_config


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"run": {"gpus": 8}, "rollout": {"prompts_per_step": 4}},
         "rollout.prompts_per_step", ">= 8"),
        ({"run": {"gpus": 2}, "stabilizers": {"surgery": {"enabled": True}}},
         "stabilizers.surgery.enabled", "run.gpus=1"),
        ({"run": {"gpus": 2}, "parallel": {"strategy": "fsdp"},
          "optim": {"per_expert_grad_clip": 1.0}}, "optim.per_expert_grad_clip", "ddp"),
        ({"run": {"gpus": 4}, "parallel": {"expert_parallel": 3}},
         "parallel.expert_parallel", "model.n_experts"),
        ({"run": {"gpus": 2}, "model": {"n_experts": 8}, "parallel": {"expert_parallel": 4}},
         "parallel.expert_parallel", "run.gpus"),
        ({"run": {"gpus": 2}, "model": {"n_experts": 0}, "parallel": {"expert_parallel": 2}},
         "parallel.expert_parallel", "MoE"),
    ],
)  # fmt: skip
def test_invalid_parallel_combinations_are_field_errors(data, field, words):
    with pytest.raises(FieldError) as err:
        validate_config(data)
    messages = err.value.as_dict()
    assert field in messages, messages
    assert any(words in m for m in messages[field]), messages


def test_valid_parallel_config():
    cfg = validate_config(
        {"run": {"gpus": 4}, "parallel": {"strategy": "ddp", "expert_parallel": 2}}
    )
    assert cfg.parallel.expert_parallel == 2 and cfg.parallel.timeout_s == 600.0


def test_shards_cover_every_prompt_once_first_ranks_take_the_rest():
    shards = [DistContext(rank=r, world_size=3).shard(7) for r in range(3)]
    assert [(s.start, s.stop) for s in shards] == [(0, 3), (3, 5), (5, 7)]


def test_single_process_is_the_identity():
    assert SINGLE.global_scales([3.0, 0.0]) == [1.0, 1.0]
    assert SINGLE.weighted_means({"a": (0.25, 10.0)}) == {"a": 0.25}
    assert SINGLE.all_true(False) is False and SINGLE.any_true(True) is True
    assert torch.equal(SINGLE.sum(torch.tensor([1.5])), torch.tensor([1.5], dtype=torch.float64))


def test_without_torchrun_nothing_is_initialised(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_distributed(2, torch.device("cpu"), "ddp", 60.0) is SINGLE


def test_world_size_must_match_run_gpus(monkeypatch):
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    with pytest.raises(DistributedSetupError, match=r"2 ranks but run\.gpus x run\.nodes is 4"):
        init_distributed(4, torch.device("cpu"), "ddp", 60.0)
