"""The learning endpoint (held-out accuracy without the engine's gap), the dose drawn
per base, and each run's record of its dose and its machine in summary.json."""

from __future__ import annotations

import statistics

import pytest
import torch
from test_runner import fast_config

from trainer import metric_keys as K
from trainer.rollout.router_noise import build_router_noise, noise_seed
from trainer.run.context import clean_engine
from trainer.run.runner import train
from trainer.run_folder.files import read_metrics


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def test_a_clean_engine_only_where_the_rollout_engine_has_a_gap():
    fp32 = fast_config(extra=['rollout.precision="fp32"'])
    assert clean_engine(fp32, 32, torch.device("cpu")) is None
    noisy = clean_engine(fast_config(extra=['rollout.precision="fp32"', "rollout.router_noise=0.3"]),
                         32, torch.device("cpu"))  # fmt: skip
    assert noisy is not None and noisy.router_noise is None and noisy.num.dtype == torch.float32


def test_the_preset_bf16_engine_gets_a_clean_fp32_twin():
    engine = clean_engine(fast_config(extra=['rollout.precision="bf16"']), 32, torch.device("cpu"))
    # moe-grpo rolls out in bf16 and trains fp32: its clean twin is fp32, noise-free.
    assert engine is not None and engine.num.dtype == torch.float32


@pytest.mark.slow
def test_noisy_run_logs_both_endpoints_and_its_measured_dose(tmp_path):
    extra = ['rollout.precision="fp32"', "rollout.router_noise=0.4"]
    noisy = train(fast_config(extra=extra), tmp_path / "noisy")
    clean = train(fast_config(extra=['rollout.precision="fp32"', "run.steps=1"]), tmp_path / "s0")
    rows = read_metrics(tmp_path / "noisy")
    evals = [r for r in rows if K.EVAL_ACCURACY in r]
    assert [r["step"] for r in evals] == [0, 2, 3]
    assert all(K.EVAL_ACCURACY_CLEAN in r for r in evals)
    # Before any update both runs hold the same base: the noisy run's clean endpoint is
    # the zero-gap run's engine figure, bit for bit.
    assert noisy["initial_accuracy_clean"] == clean["initial_accuracy"]
    assert clean["initial_accuracy_clean"] == clean["initial_accuracy"]
    assert noisy["final_accuracy_clean"] == evals[-1][K.EVAL_ACCURACY_CLEAN]
    assert noisy["final_accuracy"] == evals[-1][K.EVAL_ACCURACY]
    # The measured dose: the mean routing inconsistency of the first steps (all 4 here).
    gaps = [r[K.MISMATCH_ROUTING_INCONSISTENCY] for r in rows]
    dose = noisy["dose"]
    assert dose["routing_gap"] == pytest.approx(statistics.fmean(gaps), abs=1e-12)
    assert dose["routing_gap"] > 0 and dose["routing_gap_steps"] == 4
    assert dose["router_noise_draw"] == "base" and dose["projection_seed"] == 0
    assert clean["dose"]["routing_gap"] == 0.0 and clean["dose"]["projection_seed"] is None
    assert noisy["environment"]["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()


def test_a_zero_gap_run_logs_one_figure_under_both_keys(tmp_path):
    train(fast_config(extra=['rollout.precision="fp32"', "run.steps=1"]), tmp_path)
    (row,) = read_metrics(tmp_path)
    assert row[K.EVAL_ACCURACY_CLEAN] == row[K.EVAL_ACCURACY]


def _projection(extra: list[str]) -> torch.Tensor:
    cfg = fast_config(extra=['rollout.precision="fp32"', "rollout.router_noise=0.2", *extra])
    return build_router_noise(cfg, torch.device("cpu"), {}).projections


def test_the_dose_is_drawn_per_base_not_per_run_seed():
    same_base = _projection(["run.seed=1", "warm_start.seed=1"])
    assert torch.equal(same_base, _projection(["run.seed=5", "warm_start.seed=1"]))
    assert not torch.equal(same_base, _projection(["run.seed=1", "warm_start.seed=2"]))
    # The causal study's runs drew theirs per run seed; the setting keeps that reproducible.
    per_run = ['rollout.router_noise_draw="run"', "warm_start.seed=1"]
    assert not torch.equal(
        _projection([*per_run, "run.seed=1"]), _projection([*per_run, "run.seed=5"])
    )
    cfg = fast_config(extra=["run.seed=9", "warm_start.seed=3"])
    assert noise_seed(cfg) == 3


def test_a_study_seed_gets_its_base_s_projection():
    """Seeds 1 and 5 of a 4-base study start from base 1: the same dose, the one the
    per-base calibration (trainer.studies.calibration, which seeds with noise_seed) measures."""
    from trainer.studies.definition import StudyDefinition

    study = StudyDefinition.from_dict(
        {
            "base": {"preset": "moe-grpo", "set": ['rollout.precision="fp32"']},
            "seeds": [1, 5],
            "seed_fields": ["warm_start.seed"],
            "bases": 4,
            "variants": [{"name": "s0.2", "set": ["rollout.router_noise=0.2"]}],
        }
    )
    one, five = (study.config_for(study.variants[0], s) for s in (1, 5))
    assert noise_seed(one) == noise_seed(five) == 1
    cpu = torch.device("cpu")
    assert torch.equal(
        build_router_noise(one, cpu, {}).projections, build_router_noise(five, cpu, {}).projections
    )
