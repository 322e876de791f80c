"""The stability study: definitions, censored collapse summaries, the runner."""

import json

import pytest

from trainer.config import ConfigError
from trainer.runner import train
from trainer.study import (
    StudyDefinition,
    censored_collapse,
    load_definition,
    markdown_table,
    run_study,
)

TINY = [
    "run.steps=2",
    "run.eval_every=1",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "algorithm.minibatches=2",
    "warm_start.max_steps=20",
    "warm_start.eval_every=10",
    "warm_start.eval_size=8",
    "task.eval_size=8",
    "run.threads=1",
]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def test_censored_collapse_never_averages_survivors_as_collapsed():
    collapsed = {"collapsed": True, "collapse_step": 40, "steps": 100}
    survived = {"collapsed": False, "collapse_step": None, "steps": 100}
    both = censored_collapse([collapsed, dict(collapsed, collapse_step=61)])
    assert (both.label, both.mean_step, both.collapsed) == ("51", 50.5, 2)
    # One survivor: the mean uses its last step and is shown as a lower bound, rounded down.
    one = censored_collapse([collapsed, dict(survived, steps=101)])
    assert (one.label, one.mean_step, one.count_label) == (">= 70", 70.5, "1/2 collapsed")
    assert censored_collapse([survived, survived]).label == ">= 100"
    assert censored_collapse([]).label == "-"


def test_builtin_definitions_cover_the_issue_variants():
    quick = load_definition("quick")
    names = {v.name for v in quick.variants}
    assert names == {
        "dense-grpo", "moe-grpo", "moe-grpo-r3", "moe-grpo-r2", "moe-gspo", "moe-gspo-r3",
        "moe-grpo-tis", "moe-grpo-lb-surgery", "moe-ppo",
    }  # fmt: skip
    assert len(quick.seeds) >= 3
    full = load_definition("full")
    assert full.config_for(full.variants[1], 0).model.n_experts >= 32


def test_bad_definition_names_the_variant_and_field():
    with pytest.raises(ConfigError) as info:
        StudyDefinition.from_dict(
            {"base": {"preset": "moe-grpo"}, "variants": [{"name": "x", "set": ["model.top_k=99"]}]}
        )
    assert "variants.x.model.top_k" in str(info.value)
    with pytest.raises(ConfigError):
        StudyDefinition.from_dict({"base": {}, "variants": []})


def test_every_quick_variant_trains_two_steps(tmp_path):
    quick = load_definition("quick")
    for variant in quick.variants:
        summary = train(quick.config_for(variant, 0, TINY), tmp_path / variant.name)
        assert summary["status"] == "succeeded" and summary["steps"] == 2, variant.name


@pytest.mark.slow
def test_study_runs_aggregates_and_resumes(tmp_path):
    study = StudyDefinition.from_dict(
        {
            "name": "tiny",
            "base": {"preset": "moe-grpo", "set": TINY},
            "seeds": [0, 1],
            "parallel": 2,
            "variants": [
                {"name": "moe", "set": []},
                {"name": "moe-r3", "set": ['stabilizers.routing_replay="r3"']},
            ],
        }
    )
    results = run_study(study, tmp_path)
    assert set(results["variants"]) == {"moe", "moe-r3"}
    row = results["variants"]["moe"]["row"]
    assert row["collapse_step"] == ">= 2" and row["collapsed"] == "0/2"
    assert row["kl_k3_x1e3"] is not None and row["routing_pct"] is not None
    table = (tmp_path / "table.md").read_text()
    assert table.startswith("| variant |") and "| moe-r3 |" in table
    assert markdown_table(results) in table
    for name in ("kl_k3.png", "routing_inconsistency.png", "accuracy.png", "collapse_steps.png"):
        assert (tmp_path / name).stat().st_size > 1000
    # A finished study is not run again.
    before = (tmp_path / "moe" / "seed0" / "summary.json").stat().st_mtime
    again = run_study(study, tmp_path)
    assert (tmp_path / "moe" / "seed0" / "summary.json").stat().st_mtime == before
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(results))
