"""Learning really happens: a short seeded GRPO run on the tiny MoE preset
raises held-out accuracy over the warm-started base it starts from."""

import pytest

from trainer.config import apply_overrides
from trainer.presets import preset_dict
from trainer.runner import train
from trainer.validation import validate_config


@pytest.mark.slow
def test_grpo_raises_held_out_accuracy(tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))
    cfg = validate_config(
        apply_overrides(
            preset_dict("moe-grpo"),
            [
                "run.steps=40",
                "run.eval_every=20",
                "run.checkpoint_every=100",
                "run.threads=2",
                "rollout.prompts_per_step=32",
                "optim.lr=1e-4",
            ],
        )
    )
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "succeeded" and not summary["collapsed"]
    # The warm start lands in its band, so RL starts from a sometimes-right policy.
    assert 0.1 <= summary["initial_accuracy"] <= 0.6
    # Held-out (greedy, never trained on) accuracy rises by at least 2 problems in 256.
    assert summary["final_accuracy"] >= summary["initial_accuracy"] + 2 / 256, summary
