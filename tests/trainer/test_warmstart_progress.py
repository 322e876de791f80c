"""Warm-start progress: its own phase in RUN_DIR/progress.json (metrics.jsonl
keeps one object per RL step), log lines with an ETA, the cache hit said."""

from __future__ import annotations

import json

import pytest
from test_runner import FAST as RUNNER_FAST

from trainer import metric_keys as K
from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.run.runner import train
from trainer.run_folder.files import PROGRESS_FILE, read_metrics
from trainer.run_folder.warmstart_progress import (
    WarmStartReporter,
    eta_seconds,
    format_eta,
    read_progress,
)
from trainer.validation import validate_config

# The runner tests' fast config, 2 steps.
FAST = [*RUNNER_FAST, "run.steps=2"]


def test_eta_extends_the_accuracy_climb_to_the_target_within_max_steps():
    # 100 steps in 50 s (0.5 s/step); accuracy 0.02 -> 0.12 (0.001/step); target 0.2:
    # 80 more steps expected -> 81 with the rounding up -> 40.5 s.
    eta = eta_seconds(
        step=100, max_steps=3000, elapsed_s=50, accuracy=0.12, first_accuracy=0.02, target=0.2
    )
    assert eta == pytest.approx(40.5)
    # No climb yet: only the upper bound (max_steps) is known.
    flat = eta_seconds(
        step=100, max_steps=300, elapsed_s=50, accuracy=0.02, first_accuracy=0.02, target=0.2
    )
    assert flat == pytest.approx(100.0)
    reached = eta_seconds(
        step=10, max_steps=300, elapsed_s=5, accuracy=0.3, first_accuracy=0.0, target=0.2
    )
    assert reached == 0.0
    assert (
        eta_seconds(step=0, max_steps=10, elapsed_s=0, accuracy=0, first_accuracy=0, target=1)
        is None
    )
    assert format_eta(40.5) == "ETA ~40 s" and format_eta(600) == "ETA ~10 min"


def test_reporter_writes_the_phase_and_logs_an_eta(tmp_path):
    now = [0.0]
    lines: list[str] = []
    reporter = WarmStartReporter(
        tmp_path, max_steps=300, target=0.2, log=lines.append, clock=lambda: now[0]
    )
    reporter.begin(0.0)
    assert read_progress(tmp_path)[K.PHASE] == K.PHASE_WARMSTART
    now[0] = 10.0
    reporter.check(50, 1.5, 0.1)
    progress = read_progress(tmp_path)
    assert progress[K.WARMSTART_STEP] == 50 and progress[K.WARMSTART_ACCURACY] == 0.1
    assert progress[K.WARMSTART_TARGET] == 0.2 and progress[K.WARMSTART_ETA_S] == pytest.approx(
        10.2
    )
    assert lines[-1] == (
        "warm start step 50/300: loss 1.500  held-out accuracy 0.100 (target 0.20)  ETA ~10 s"
    )
    reporter.finish()
    assert read_progress(tmp_path)[K.PHASE] == K.PHASE_TRAINING
    assert not list(tmp_path.glob("*.tmp"))  # rewritten atomically


def test_a_resumed_warm_start_reports_from_its_step_at_its_own_pace(tmp_path):
    """A warm start that continues an interrupted one's saved state (test_warmstart_resume.py)
    says so, counts on from the saved step and times its ETA on its own steps."""
    now = [0.0]
    lines: list[str] = []
    reporter = WarmStartReporter(
        tmp_path, max_steps=300, target=0.2, log=lines.append, clock=lambda: now[0]
    )
    reporter.resumed(100, first_accuracy=0.0, accuracy=0.0)
    assert read_progress(tmp_path)[K.WARMSTART_STEP] == 100
    assert "resuming at step 100/300" in lines[-1]
    now[0] = 10.0
    reporter.check(150, 1.0, 0.0)  # 50 steps in 10 s here; no climb: 150 steps left
    assert read_progress(tmp_path)[K.WARMSTART_ETA_S] == pytest.approx(30.0)


def test_a_run_reports_its_warm_start_then_a_cache_hit(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))
    cfg = validate_config(apply_overrides(preset_dict("moe-grpo"), FAST))
    train(cfg, tmp_path / "first")
    first = json.loads((tmp_path / "first" / PROGRESS_FILE).read_text())
    assert first[K.PHASE] == K.PHASE_TRAINING and first[K.WARMSTART_CACHED] is False
    assert first[K.WARMSTART_MAX_STEPS] == 40
    # metrics.jsonl is untouched by the warm start: one object per RL step.
    assert [r["step"] for r in read_metrics(tmp_path / "first")] == [0, 1]
    assert not any(k.startswith("warmstart/") for r in read_metrics(tmp_path / "first") for k in r)

    train(cfg, tmp_path / "second")
    second = json.loads((tmp_path / "second" / PROGRESS_FILE).read_text())
    assert second[K.WARMSTART_CACHED] is True and second[K.PHASE] == K.PHASE_TRAINING
    assert "using the cached base policy" in capsys.readouterr().err


def test_a_warm_start_that_misses_its_target_says_so(tmp_path, monkeypatch, capsys):
    """Two SFT steps cannot reach a 0.9 target: the run says the base missed it, with
    the numbers and what to change, instead of starting RL silently."""
    from trainer.run.warmstart import missed_target

    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))
    overrides = [*FAST, "warm_start.max_steps=2", "warm_start.eval_every=1",
                 "warm_start.target_accuracy_low=0.9", "warm_start.target_accuracy_high=1.0"]  # fmt: skip
    cfg = validate_config(apply_overrides(preset_dict("moe-grpo"), overrides))
    train(cfg, tmp_path / "run")
    out = capsys.readouterr().err  # the run's log
    assert "WARNING: warm start missed its target" in out
    assert "after 2 of warm_start.max_steps=2 SFT steps" in out and "target_accuracy_low=0.9" in out
    assert missed_target(cfg, 0.95, 10) is None
    assert "overshot" in missed_target(cfg.model_copy(update={"warm_start": cfg.warm_start.model_copy(
        update={"target_accuracy_high": 0.92})}), 0.95, 10)  # fmt: skip
