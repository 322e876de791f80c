"""The metric mappings (lab/tracking/metric_map.py) against the names the frameworks
really log.

TRL and transformers are installed (the dev extra): their mapped names are
looked up in the installed source files that log them. verl, slime and
OpenRLHF are not dependencies: their logged names were read from their source
and recorded per version in tests/fixtures/frameworks/ (checked against the
mapping in tests/platform/test_tracking_frameworks.py)."""

from __future__ import annotations

import inspect

import pytest

from lab.tracking import metric_map
from trainer import metric_keys as mk


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
        if bare.startswith("sampling/sampling_logp_difference/"):
            assert f'self._metrics[mode]["{bare}"]' in grpo, name
        elif bare in ("loss", "grad_norm", "learning_rate"):
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
    trl = metric_map.FRAMEWORK_MAPS[metric_map.TRL]
    assert set().union(*(t.values() for t in metric_map.FRAMEWORK_MAPS.values())) <= lab_keys
    # TRL: the MLflow and TensorBoard spellings of one quantity share a key; nothing else
    by_key: dict[str, set[str]] = {}
    for name, key in trl.items():
        by_key.setdefault(key, set()).add(name.removeprefix("train/"))
    assert all(len(names) == 1 for names in by_key.values()), by_key


def test_train_inference_kl_is_mapped_only_where_it_is_the_lab_estimator():
    assert metric_map.lab_key("rollout_corr/kl", "verl") == mk.MISMATCH_KL_K1
    assert metric_map.lab_key("rollout_corr/k3_kl", "verl") == mk.MISMATCH_KL_K3
    assert metric_map.lab_key("train/vllm_kl", "openrlhf") == mk.MISMATCH_KL_K1
    # verl 0.6.0's names for the same two
    assert metric_map.lab_key("mismatch/mismatch_kl", "verl") == mk.MISMATCH_KL_K1
    assert metric_map.lab_key("mismatch/mismatch_k3_kl", "verl") == mk.MISMATCH_KL_K3
    # mean absolute log-prob differences: another quantity, under its own lab key
    assert metric_map.lab_key("train/train_rollout_logprob_abs_diff", "slime") == (
        mk.MISMATCH_LOGP_ABS_DIFF
    )
    assert metric_map.lab_key("sampling/sampling_logp_difference/mean", "trl") == (
        mk.MISMATCH_LOGP_ABS_DIFF
    )
    # and verl 0.5's absolute probability difference
    assert metric_map.lab_key("training/rollout_probs_diff_mean", "verl") == (
        mk.MISMATCH_PROB_ABS_DIFF
    )


def test_trl_timings_are_charted_at_the_step_they_timed():
    assert metric_map.step_shift("trl", "profiling/Time taken: GRPOTrainer._prepare_inputs") == 1
    assert metric_map.step_shift("trl", "reward") == 0
    assert metric_map.step_shift("verl", "profiling/x") == 0


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
