"""Stabilizers in real runs of the loop: warm-up schedule, temperature controller,
and every preset for two steps."""

from __future__ import annotations

import pytest

from trainer import metric_keys as K
from trainer.config import apply_overrides
from trainer.config.presets import PRESETS, preset_dict
from trainer.run.runner import train
from trainer.run_folder.files import read_metrics
from trainer.validation import validate_config

TINY = [
    "run.steps=2",
    "run.eval_every=1",
    "run.checkpoint_every=2",
    "run.threads=1",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "algorithm.minibatches=2",
    "warm_start.max_steps=20",
    "warm_start.eval_every=20",
    "warm_start.eval_size=16",
    "task.eval_size=16",
]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def run(tmp_path, preset: str, extra: list[str]) -> list[dict]:
    cfg = validate_config(apply_overrides(preset_dict(preset), TINY + extra))
    summary = train(cfg, tmp_path, log=lambda message: None)
    assert summary["status"] == "succeeded"
    return read_metrics(tmp_path)


def test_warmup_share_follows_its_schedule_in_a_run(tmp_path):
    rows = run(
        tmp_path,
        "moe-grpo-r3-warmup",
        ["run.steps=6", "rollout.prompts_per_step=4", "stabilizers.replay.warmup_steps=4",
         "stabilizers.replay.warmup_keep_frac=0.5"],
    )  # fmt: skip
    replayed = [r[K.R3_REPLAYED_FRAC] for r in rows]
    # own-choice share p = 0.5 * (1 - step / 4): replayed 0.5, 0.625, 0.75, 0.875, then 1
    expected = [0.5, 0.625, 0.75, 0.875, 1.0, 1.0]
    assert replayed == pytest.approx(expected, abs=0.1)  # a draw over ~300 token-layers
    assert replayed[4:] == [1.0, 1.0]
    for row in rows[4:]:  # after the warm-up the training routing IS the rollout's
        assert row[K.MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY] == 0.0
        assert K.MISMATCH_ROUTING_INCONSISTENCY in row
        assert row[K.R3_BYTES_PER_TOKEN_LAYER] == pytest.approx(0.75, abs=0.01)


def test_temperature_controller_multiplies_as_configured_in_a_run(tmp_path):
    # share 1.0001x the fair share counts as a monopoly: the controller heats every check
    rows = run(
        tmp_path,
        "moe-grpo-temperature",
        ["run.steps=3", "stabilizers.router_temperature.interval=1",
         "stabilizers.router_temperature.monopoly_share=1.0001",
         "stabilizers.router_temperature.heat_factor=1.5"],
    )  # fmt: skip
    assert [r[K.ROUTER_TEMPERATURE] for r in rows] == pytest.approx([1.0, 1.5, 2.25])


# Keys each preset's stabilizers must add to every step's metrics.
EXPECTED_KEYS = {
    "moe-grpo-r3": [K.R3_REPLAYED_FRAC, K.MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY],
    "moe-grpo-r3-warmup": [K.R3_REPLAYED_FRAC],
    "moe-grpo-r3-rle": [K.R3_REPLAYED_FRAC, K.R3_BYTES_PER_TOKEN_LAYER],
    "moe-gspo-r3": [K.R3_REPLAYED_FRAC],
    "moe-grpo-tis": [K.TIS_CLIP_FRAC, K.TIS_RATIO_MEAN],
    "moe-grpo-mis": [K.TIS_MASKED_FRAC],
    "moe-grpo-icepop": [K.TIS_MASKED_FRAC],
    "moe-grpo-auxloss": [K.LB_AUX_LOSS],
    "moe-grpo-auxloss-seq": [K.LB_AUX_LOSS],
    "moe-grpo-zloss": [K.LB_Z_LOSS],
    "moe-grpo-router-kl": [K.LB_ROUTER_KL],
    "moe-grpo-lb": [K.LB_AUX_LOSS, K.LB_Z_LOSS],
    "moe-grpo-lb-surgery": [K.LB_AUX_LOSS, K.LB_Z_LOSS, K.GRADS_COS_POLICY_AUX,
                            K.GRADS_SURGERY_FRAC],
    "moe-grpo-lb-surgery-all": [K.GRADS_COS_POLICY_AUX, K.GRADS_SURGERY_FRAC],
    "moe-ppo": [K.VALUE_LOSS],
}  # fmt: skip
# gpu-* presets (12 layers, width 768) are validated in test_config, not run on a CPU.
# Longer tasks pay a fresh warm start and longer rollouts: over 10 s here.
SLOW_PRESETS = {"moe-grpo-scratchpad", "sort-moe-grpo", "text-grpo"}
TINY_PRESETS = [
    pytest.param(name, marks=[pytest.mark.slow] if name in SLOW_PRESETS else [])
    for name in PRESETS
    if not name.startswith("gpu-")
]


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_every_preset_runs_two_steps(tmp_path, preset):
    rows = run(tmp_path, preset, [])
    assert [r["step"] for r in rows] == [0, 1]
    for key in EXPECTED_KEYS.get(preset, []):
        for row in rows:
            assert key in row, key
    if K.GRADS_SURGERY_FRAC in rows[0]:
        assert all(0.0 <= r[K.GRADS_SURGERY_FRAC] <= 1.0 for r in rows)
        assert all(-1.0 <= r[K.GRADS_COS_POLICY_AUX] <= 1.0 for r in rows)
