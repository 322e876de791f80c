"""The stability study: definitions, censored collapse summaries, the runner."""

import json

import pytest

from trainer.errors import FieldError
from trainer.run.runner import train
from trainer.studies.definition import BUILTIN_STUDIES, StudyDefinition, load_definition
from trainer.studies.results import censored_collapse, markdown_table
from trainer.studies.study import run_study

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
    gpu = load_definition("gpu-mismatch")
    assert gpu.config_for(gpu.variants[0], 0).model.n_experts >= 32


def test_the_gpu_study_asks_the_real_mismatch_question():
    """An fp32 trainer against bf16 and fp8 engines (no router noise), the fp32 engine as
    the zero-gap control, R3 at each low precision, >= 8 seeds a cell, 400 steps."""
    study = load_definition("gpu-mismatch")
    configs = {v.name: study.config_for(v, 5) for v in study.variants}
    assert len(study.seeds) >= 8 and study.analysis == "edge"
    assert all(c.optim.param_dtype == "fp32" and not c.run.tf32 for c in configs.values())
    assert all(c.rollout.router_noise == 0 and c.run.steps == 400 for c in configs.values())
    assert all((c.model.n_layers, c.model.n_experts) == (8, 32) for c in configs.values())
    precisions = {(c.rollout.precision, c.stabilizers.replay.mode) for c in configs.values()}
    assert precisions == {("fp32", "none"), ("bf16", "none"), ("bf16", "r3"), ("fp8", "none"),
                          ("fp8", "r3")}  # fmt: skip


@pytest.mark.parametrize("name", ["causal"])
def test_causal_definitions_ask_the_routing_only_question(name):
    """The CPU study: a routing-only dose on fp32 rollouts, R3 at each
    non-zero dose, the dense zero-gap control, >= 10 runs a cell over >= 4 bases."""
    study = load_definition(name)
    assert study.analysis == "causal" and study.bases >= 4 and len(study.seeds) >= 10
    configs = {v.name: study.config_for(v, 5) for v in study.variants}
    assert all(c.rollout.precision == "fp32" for c in configs.values())
    assert all(c.algorithm.behavior_logprobs == "train" for c in configs.values())
    assert all(c.warm_start.seed == 5 % study.bases for c in configs.values())
    doses = {c.rollout.router_noise for c in configs.values() if c.model.is_moe}
    assert 0.0 in doses and len(doses) >= 4
    replayed = {
        c.rollout.router_noise for c in configs.values() if c.stabilizers.replay.mode == "r3"
    }
    assert replayed and 0.0 not in replayed and replayed <= doses
    assert any(not c.model.is_moe for c in configs.values())


def test_bases_share_each_base_over_the_seeds_and_need_seed_fields():
    data = {
        "base": {"preset": "moe-grpo"},
        "seeds": [0, 1, 2, 3, 4],
        "seed_fields": ["warm_start.seed"],
        "bases": 2,
        "variants": [{"name": "a"}],
    }
    study = StudyDefinition.from_dict(data)
    assert [study.config_for(study.variants[0], s).warm_start.seed for s in range(5)] == [
        0, 1, 0, 1, 0
    ]  # fmt: skip
    with pytest.raises(FieldError, match="bases"):
        StudyDefinition.from_dict({**data, "seed_fields": []})
    with pytest.raises(FieldError, match="bases"):
        StudyDefinition.from_dict({**data, "bases": 0})


def test_bad_definition_names_the_variant_and_field():
    with pytest.raises(FieldError) as info:
        StudyDefinition.from_dict(
            {"base": {"preset": "moe-grpo"}, "variants": [{"name": "x", "set": ["model.top_k=99"]}]}
        )
    assert "variants.x.model.top_k" in str(info.value)
    with pytest.raises(FieldError):
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
                {"name": "moe-r3", "set": ['stabilizers.replay.mode="r3"']},
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
    for name in ("kl_k3.png", "routing_inconsistency.png", "accuracy.png", "collapse_steps.png",
                 "survival.png"):  # fmt: skip
        assert (tmp_path / name).stat().st_size > 1000
    stats = results["statistics"]
    assert stats["reference"] == "moe"  # no moe-grpo variant: the first
    assert stats["variants"]["moe-r3"]["logrank_p"] is None  # no collapse in either arm
    assert stats["variants"]["moe"]["median"] is None  # not reached
    assert [row["signal"] for row in stats["lead_lag"]] == [
        "mismatch/kl_k3", "mismatch/routing_inconsistency"]  # fmt: skip
    assert "| variant | collapsed | median time-to-collapse" in table
    assert "| variant | runs | mean k3 x1e-3 [95% CI] | median k3" in table
    moe = results["variants"]["moe"]["seeds"][0]
    assert moe["kl_k3_median"] > 0 and moe["kl_k3_steps"] == 2
    # A finished study is not run again.
    before = (tmp_path / "moe" / "seed0" / "summary.json").stat().st_mtime
    again = run_study(study, tmp_path)
    assert (tmp_path / "moe" / "seed0" / "summary.json").stat().st_mtime == before
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(results))


@pytest.mark.slow
def test_a_causal_study_writes_its_preregistered_report(tmp_path):
    study = StudyDefinition.from_dict(
        {
            "name": "tiny-causal",
            "base": {"preset": "moe-grpo", "set": [*TINY, 'rollout.precision="fp32"']},
            "seeds": [0, 1],
            "seed_fields": ["warm_start.seed"],
            "bases": 1,
            "parallel": 2,
            "analysis": "causal",
            "variants": [
                {"name": "moe-s0", "set": []},
                {"name": "moe-s1", "set": ["rollout.router_noise=1.0"]},
                {"name": "dense", "set": ["model.n_experts=0"]},
            ],
        }
    )
    run_study(study, tmp_path)
    report = json.loads((tmp_path / "causal.json").read_text())
    assert report["runs"] == 6
    cells = report["cells"]
    assert cells["moe-s0"]["routing_gap"] == 0.0 and cells["dense"]["routing_gap"] == 0.0
    assert cells["moe-s1"]["routing_gap"] > 0.05  # sigma 1 flips many routes
    assert cells["moe-s1"]["kl_k3"] > cells["moe-s0"]["kl_k3"]
    assert cells["moe-s0"]["bases"] == [0]
    # No collapse in two steps: no dose model; the decision gives the exact bound.
    assert report["dose_model"] is None and report["decision"].startswith("no collapse")
    md = (tmp_path / "causal.md").read_text()
    assert "| H1: MoE hazard per 10 points of routing gap" in md
    assert (tmp_path / "causal_dose_response.png").stat().st_size > 1000


@pytest.mark.parametrize("name", BUILTIN_STUDIES)
def test_every_builtin_study_loads_and_its_configs_validate(name):
    """Every file in trainer/studies/ is a built-in study, and each of its runs' configs
    is a valid one (the study refuses to start otherwise, after its bases are trained)."""
    study = load_definition(name)
    for variant in study.variants:
        for seed in study.seeds:
            cfg = study.config_for(variant, seed)
            assert cfg.run.seed == seed


def test_dose_and_fixes_definitions():
    dose = load_definition("dose")
    assert len(dose.variants) == 12 and len(dose.seeds) >= 5
    assert dose.dose["levels"] == ["fp32", "fp16", "bf16", "fp8"]
    names = {v.name for v in dose.variants}
    assert {f"{arm}-{level}" for arm in dose.dose["arms"] for level in dose.dose["levels"]} == names
    fixes = load_definition("fixes")
    assert fixes.reference == "moe-grpo" and len(fixes.seeds) >= 5
    wanted = {"moe-grpo-r3", "moe-grpo-r2", "moe-gspo", "moe-gspo-r3", "moe-grpo-tis",
              "moe-grpo-mis", "moe-grpo-icepop", "moe-grpo-lb-surgery", "moe-ppo",
              "moe-grpo-temperature", "moe-grpo-expert-clip"}  # fmt: skip
    assert wanted <= {v.name for v in fixes.variants}


@pytest.mark.slow
def test_a_slice_reports_on_every_finished_run_of_the_whole_study(tmp_path):
    """Slices run one after another (``--variants``) leave one report over the whole
    study, not the last slice's alone."""
    from trainer.studies.definition import select

    whole = StudyDefinition.from_dict(
        {
            "name": "tiny-slices",
            "base": {"preset": "moe-grpo", "set": TINY},
            "seeds": [0],
            "parallel": 1,
            "variants": [
                {"name": "moe", "set": []},
                {"name": "moe-r3", "set": ['stabilizers.replay.mode="r3"']},
            ],
        }
    )
    first = run_study(select(whole, "moe", None), tmp_path, whole=whole)
    assert first["variants"]["moe"]["row"]["collapsed"] == "0/1"
    assert not (tmp_path / "moe-r3").exists()  # the slice ran only its own runs
    second = run_study(select(whole, "moe-r3", None), tmp_path, whole=whole)
    assert {v: r["row"]["collapsed"] for v, r in second["variants"].items()} == {
        "moe": "0/1",
        "moe-r3": "0/1",
    }
    table = (tmp_path / "table.md").read_text()
    assert "| moe |" in table and "| moe-r3 |" in table


def test_a_slice_of_a_study_by_variants_and_seeds():
    from trainer.studies.definition import select

    dose = load_definition("dose")
    part = select(dose, "moe-grpo-fp8,dense-grpo-fp8", "0,3")
    assert [v.name for v in part.variants] == ["moe-grpo-fp8", "dense-grpo-fp8"]
    assert part.seeds == [0, 3] and part.dose == dose.dose
    with pytest.raises(FieldError, match="variants"):
        select(dose, "nope", None)
    with pytest.raises(FieldError, match="seeds"):
        select(dose, None, "a,b")


def test_seed_fields_give_every_seed_its_own_base():
    kl = load_definition("kl-order")
    assert kl.seed_fields == ["warm_start.seed"] and len(kl.seeds) >= 3
    assert {v.name for v in kl.variants} == {"dense-grpo", "moe-grpo", "moe-grpo-r3"}
    configs = [kl.config_for(kl.variants[1], seed) for seed in kl.seeds]
    assert [c.warm_start.seed for c in configs] == kl.seeds == [c.run.seed for c in configs]
    assert configs[0].task.scratchpad  # long responses
    # Different bases: the warm-start cache key differs per seed, not per variant's RL seed only.
    assert len({c.hash("model", "task", "warm_start") for c in configs}) == len(kl.seeds)
    base = {"base": {"preset": "moe-grpo"}, "variants": [{"name": "x"}]}
    for bad in ("warm_start.seed", ["run.seed"], [""]):
        with pytest.raises(FieldError, match="seed_fields"):
            StudyDefinition.from_dict({**base, "seed_fields": bad})
    with pytest.raises(FieldError, match=r"variants\.x"):  # an unknown path is a field error
        StudyDefinition.from_dict({**base, "seed_fields": ["warm_start.nope"]})


def test_k3_profile_median_and_spikes_by_hand():
    from trainer.studies.results import k3_profile

    # Median of [1, 2, 3, 50, None, 2] (None skipped) = 2; spikes are > 10 x 2 = 20: one (50).
    assert k3_profile([1e-3, 2e-3, 3e-3, 50e-3, None, 2e-3]) == {
        "kl_k3_median": 2e-3, "kl_k3_spikes": 1, "kl_k3_steps": 5}  # fmt: skip
    assert k3_profile([None]) == {"kl_k3_median": None, "kl_k3_spikes": None, "kl_k3_steps": 0}
    assert k3_profile([0.0, 0.0, 1e-3])["kl_k3_spikes"] == 0  # a zero median has no spikes


@pytest.mark.slow
def test_distinct_bases_train_in_parallel_once_each(tmp_path, monkeypatch):
    from trainer.studies.study import _train_bases

    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))
    study = StudyDefinition.from_dict(
        {"base": {"preset": "moe-grpo", "set": TINY}, "seeds": [0, 1],
         "seed_fields": ["warm_start.seed"], "variants": [{"name": "moe"}]}
    )  # fmt: skip
    configs = [study.config_for(study.variants[0], seed) for seed in study.seeds]
    _train_bases(configs, 2, "off", None, tmp_path / "bases", None)
    assert len(list((tmp_path / "cache").rglob("*.pt"))) == 2


def test_set_may_not_override_what_a_variant_sets_itself():
    from trainer.studies.definition import check_overrides

    kl = load_definition("kl-order")
    with pytest.raises(FieldError, match=r"dense-grpo set model\.n_experts"):
        check_overrides(kl, ["model.n_experts=16"])
    check_overrides(kl, ["model.n_layers=4", "run.steps=10"])  # nobody's own field: fine


def test_a_dry_plan_of_the_gpu_study_runs_on_the_cpu(tmp_path, capsys):
    """The GPU study is planned before a slot, on any machine: no run, no warm start."""
    from trainer.cli import main as cli_main

    code = cli_main(["study", "gpu-mismatch", "--out", str(tmp_path / "gpu"), "--dry",
                     "--device", "NVIDIA H200", "--budget-s", "720"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "study gpu-mismatch: 40 runs" in out and "plan on NVIDIA H200" in out
    assert not (tmp_path / "gpu" / "moe-bf16").exists()
