"""The metric mappings (lab/tracking/metric_map.py) against the names the frameworks
really log.

TRL and transformers are installed (the dev extra): their mapped names are
looked up in the installed source files that log them. verl, slime and
OpenRLHF are not dependencies: their logged names are listed here as read
from their source at the commits metric_map.py names, file by file."""

from __future__ import annotations

import inspect

import pytest

from lab.tracking import metric_map
from trainer import metric_keys as mk

# verl b178a3c
VERL_LOGGED = {
    # verl/trainer/ppo/rollout_corr_helper.py: metrics["kl"], ["k3_kl"], ["rollout_is_mean"],
    # ["rollout_is_max"], ... prefixed f"rollout_corr/{key}"
    "rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_is_max", "rollout_corr/training_ppl", "rollout_corr/chi2_token",
    # verl/trainer/ppo/core_algos.py, verl/workers/actor/dp_actor.py
    "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy",
    "actor/pg_loss", "actor/kl_loss", "actor/kl_coef", "actor/grad_norm",
    # verl/workers/fsdp_workers.py
    "actor/lr",
    # verl/trainer/ppo/metric_utils.py
    "critic/score/mean", "critic/rewards/mean", "response_length/mean",
    "response_length/clip_ratio", "timing_s/step", "timing_s/gen", "perf/throughput",
}  # fmt: skip
# slime 624b824: slime/backends/megatron_utils/model.py f"train/{key}" of loss.py's
# reported_loss; slime/observability/train_metric_utils.py and rollout_metrics.py
SLIME_LOGGED = {
    "train/loss", "train/pg_loss", "train/entropy_loss", "train/pg_clipfrac", "train/ppo_kl",
    "train/train_rollout_logprob_abs_diff", "train/kl_loss", "train/tis", "train/ois",
    "train/tis_clipfrac", "train/tis_abs", "train/grad_norm", "rollout/raw_reward",
    "rollout/rewards", "rollout/log_probs", "rollout/response_len/mean",
    "rollout/response_len/max", "perf/rollout_time",
}  # fmt: skip
# OpenRLHF 3c3be62: openrlhf/trainer/ray/ppo_actor.py and ppo_utils/experience_maker.py
# info keys, written as f"train/{k}" by openrlhf/utils/logging_utils.py
OPENRLHF_LOGGED = {
    f"train/{k}"
    for k in (
        "vllm_kl", "ppo_clip_ratio", "ppo_kl", "kl", "policy_loss", "entropy_loss",
        "actor_grad_norm", "actor_lr", "reward", "response_length", "logprobs_diff",
    )
}  # fmt: skip
LOGGED = {
    metric_map.VERL: VERL_LOGGED,
    metric_map.SLIME: SLIME_LOGGED,
    metric_map.OPENRLHF: OPENRLHF_LOGGED,
}


@pytest.mark.parametrize("framework", [metric_map.VERL, metric_map.SLIME, metric_map.OPENRLHF])
def test_every_mapped_name_is_one_the_framework_logs(framework):
    missing = set(metric_map.FRAMEWORK_MAPS[framework]) - LOGGED[framework]
    assert not missing, f"{framework} does not log {sorted(missing)}"


@pytest.mark.slow
def test_trl_names_are_in_the_installed_trl_and_transformers_sources():
    pytest.importorskip("trl")
    from transformers import trainer as hf_trainer
    from transformers.integrations import integration_utils
    from trl.rewards import accuracy_rewards
    from trl.trainer import grpo_trainer

    grpo = inspect.getsource(grpo_trainer)
    hf = inspect.getsource(hf_trainer)
    for name in metric_map.FRAMEWORK_MAPS[metric_map.TRL]:
        bare = name.removeprefix("train/")
        if bare in ("loss", "grad_norm", "learning_rate"):
            assert f'logs["{bare}"]' in hf, name
        elif bare == "rewards/accuracy_reward/mean":
            assert 'f"rewards/{reward_func_name}/mean"' in grpo
            assert "def accuracy_reward(" in inspect.getsource(accuracy_rewards)
        else:
            assert f'_metrics[mode]["{bare}"]' in grpo, name
    # the TensorBoard spelling: transformers' TensorBoardCallback writes "train/" + name
    assert integration_utils.rewrite_logs({"kl": 1.0}) == {"train/kl": 1.0}


def test_targets_are_lab_keys_and_one_name_per_key():
    lab_keys = set(mk.SCALAR_KEYS)
    for framework, table in metric_map.FRAMEWORK_MAPS.items():
        assert set(table.values()) <= lab_keys, framework
        # the MLflow and TensorBoard spellings of one quantity may share a key; nothing else
        by_key: dict[str, set[str]] = {}
        for name, key in table.items():
            by_key.setdefault(key, set()).add(name.removeprefix("train/"))
        assert all(len(names) == 1 for names in by_key.values()), (framework, by_key)


def test_train_inference_kl_is_mapped_only_where_it_is_the_lab_estimator():
    assert metric_map.lab_key("rollout_corr/kl", "verl") == mk.MISMATCH_KL_K1
    assert metric_map.lab_key("rollout_corr/k3_kl", "verl") == mk.MISMATCH_KL_K3
    assert metric_map.lab_key("train/vllm_kl", "openrlhf") == mk.MISMATCH_KL_K1
    # mean absolute log-prob differences: another quantity, kept as logged
    assert metric_map.lab_key("train/train_rollout_logprob_abs_diff", "slime") == (
        "train/train_rollout_logprob_abs_diff"
    )
    assert metric_map.lab_key("sampling/sampling_logp_difference/mean", "trl") == (
        "sampling/sampling_logp_difference/mean"
    )


def test_unknown_framework_and_unmapped_names():
    assert metric_map.lab_key("my/own_metric") == "my/own_metric"
    assert metric_map.lab_key("actor/pg_clipfrac") == mk.POLICY_CLIP_FRAC  # verl's alone
    assert metric_map.lab_key("loss") == "loss"  # bare: mapped only for a known framework
    assert metric_map.lab_key("loss", "trl") == mk.POLICY_LOSS
    assert metric_map.detect_framework(["rollout_corr/kl", "loss"]) == "verl"
    assert metric_map.detect_framework(["train/pg_clipfrac", "rollout/raw_reward"]) == "slime"
    assert metric_map.detect_framework(["clip_ratio/region_mean", "reward"]) == "trl"
    assert metric_map.detect_framework(["train/vllm_kl"]) == "openrlhf"
    assert metric_map.detect_framework(["loss", "reward"]) == ""


def test_expert_load_slots():
    assert metric_map.vector_slot("experts/load/L3/e17") == ("experts/load/L3", 17)
    assert metric_map.vector_slot("experts/load/L3") is None
    assert metric_map.vector_slot("experts/load/L3/e1x") is None
