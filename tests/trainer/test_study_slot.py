"""A study that fits a slot: bases exported and imported by content and environment,
a time budget that stops cleanly and resumes, the plan from measured rows."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from trainer.cli import main as cli_main
from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.devices.environment import cpu_key
from trainer.errors import BAD_INPUT_EXIT_CODE, FieldError
from trainer.run.runner import train
from trainer.run.warmstart import cache_dir, train_base_policy, warm_start_key
from trainer.studies import budget
from trainer.studies.bases import BaseMismatch, export_base, held_bases, import_base
from trainer.studies.budget import Job, StepRow, plan
from trainer.studies.definition import StudyDefinition
from trainer.studies.study import run_study
from trainer.tasks import make_task
from trainer.validation import validate_config

TINY = [
    "run.steps=3", "run.eval_every=10", "run.checkpoint_every=10",
    "rollout.prompts_per_step=2", "rollout.group_size=2", "algorithm.minibatches=1",
    "warm_start.max_steps=4", "warm_start.eval_every=2", "warm_start.eval_size=8",
    "task.eval_size=8", "run.threads=1", "run.device=cpu",
]  # fmt: skip


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))


def _cfg(extra=()):
    return validate_config(apply_overrides(preset_dict("moe-grpo"), [*TINY, *extra]))


def _base(cfg):
    task = make_task(cfg.task)
    vocab = task.tokenizer.vocab_size
    device = torch.device("cpu")
    base = train_base_policy(cfg, task, vocab, device, log=lambda *_: None)
    return warm_start_key(cfg, vocab, device), base, device


def test_a_base_travels_by_content_and_environment(tmp_path, monkeypatch):
    cfg = _cfg()
    key, base, device = _base(cfg)
    weights = export_base(cfg, key, device, tmp_path / "bases")
    manifest = json.loads(weights.with_suffix(".json").read_text())
    assert weights.name == f"{key}--cpu-{cpu_key().lower()}-t1-float32.pt"
    assert manifest["key"] == key and manifest["environment"]["device_type"] == "cpu"
    assert manifest["content"]["config_hash"] == cfg.hash("model", "task", "warm_start")
    assert held_bases(tmp_path / "bases") == {manifest["content"]["config_hash"]}
    # A bare machine: an empty cache. The import installs the same bytes, and the
    # warm start then finds the base instead of training it.
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "bare"))
    assert "imported from" in import_base(key, device, tmp_path / "bases")
    assert (cache_dir() / f"{key}.pt").read_bytes() == weights.read_bytes()
    _, again, _ = _base(cfg)
    assert again.cached and all(torch.equal(again.state_dict[k], v)
                                for k, v in base.state_dict.items())  # fmt: skip
    assert import_base("0" * 16, device, tmp_path / "bases") is None  # not held: trained here


def test_a_base_from_another_environment_or_with_other_bytes_is_refused(tmp_path, monkeypatch):
    cfg = _cfg()
    key, _, device = _base(cfg)
    weights = export_base(cfg, key, device, tmp_path / "bases")
    manifest_path = weights.with_suffix(".json")
    manifest = json.loads(manifest_path.read_text())
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "bare"))
    gpu = dict(manifest, environment={**manifest["environment"], "device_type": "cuda",
                                      "capability": "sm90"})  # fmt: skip
    manifest_path.write_text(json.dumps(gpu))
    with pytest.raises(
        BaseMismatch, match=r"trained on cuda-sm90-float32, and this machine is cpu"
    ):
        import_base(key, device, tmp_path / "bases")
    manifest_path.write_text(json.dumps(dict(manifest, sha256="0" * 64)))
    with pytest.raises(BaseMismatch, match="do not match its manifest"):
        import_base(key, device, tmp_path / "bases")
    assert not (cache_dir() / f"{key}.pt").exists()  # nothing was installed


def _study(parallel: int = 1) -> StudyDefinition:
    return StudyDefinition.from_dict({
        "name": "slot", "base": {"preset": "moe-grpo", "set": TINY}, "seeds": [0, 1],
        "parallel": parallel, "variants": [{"name": "moe"}],
    })  # fmt: skip


@pytest.mark.slow
def test_a_budgeted_study_stops_cleanly_resumes_and_imports_its_bases(tmp_path, monkeypatch):
    out = tmp_path / "first"
    # A budget that ends at once: the warm start stops at its first step (its state
    # kept), no run starts, and the sitting says so.
    run_study(_study(), out, budget_s=budget.REPORT_RESERVE_S + 0.01)
    sitting = budget.read_sittings(out)[-1]
    assert [b["status"] for b in sitting["bases"]] == ["stopped"] and sitting["runs"] == []
    assert list(cache_dir().glob("*.partial.pt"))  # the next sitting continues it
    # The next sitting finishes the base (exporting it) and both runs.
    run_study(_study(), out, budget_s=600)
    sitting = budget.read_sittings(out)[-1]
    assert sitting["bases"][0]["how"] == "trained here"
    assert sorted(r["status"] for r in sitting["runs"]) == ["succeeded", "succeeded"]
    assert all(r["step_s"] > 0 and r["start_s"] is not None for r in sitting["runs"])
    assert len(list((out / "bases").glob("*.pt"))) == 1
    rows = budget.folder_rows("slot", out)
    assert [(r.device, r.variant, r.packed) for r in rows] == [("cpu", "moe", 1)]
    assert rows[0].start_s is not None and rows[0].warm_start_s > 0
    # A bare machine with the bases carried: imported, not trained.
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "bare"))
    results = run_study(_study(), tmp_path / "second", bases_dir=out / "bases")
    sitting = budget.read_sittings(tmp_path / "second")[-1]
    assert "imported from" in sitting["bases"][0]["how"]
    assert len(results["variants"]["moe"]["seeds"]) == 2


def test_a_run_that_cannot_get_going_before_the_deadline_is_not_started(tmp_path):
    from trainer.studies.study import _run_one

    record = _run_one((_cfg().to_dict(), str(tmp_path / "moe" / "seed0"), time.time()))
    assert record["status"] == "not started" and not (tmp_path / "moe").exists()


def test_a_run_stops_at_its_deadline_with_a_checkpoint_and_resumes(tmp_path):
    cfg = _cfg(["warm_start.enabled=false"])
    summary = train(cfg, tmp_path / "run", stop_at=time.time(), log=lambda *_: None)
    assert (summary["status"], summary["steps"]) == ("stopped", 1)  # the step in flight ends
    assert (tmp_path / "run" / "checkpoints" / "last.pt").exists()
    summary = train(cfg, tmp_path / "run", resume=True, log=lambda *_: None)
    assert (summary["status"], summary["steps"]) == ("succeeded", 3)
    # Past its deadline in the warm start: stopped there, no checkpoint (nothing to keep).
    warm = _cfg(
        [
            "warm_start.max_steps=50",
            "warm_start.target_accuracy_low=0.99",
            "warm_start.target_accuracy_high=1.0",
        ]
    )
    summary = train(warm, tmp_path / "warm", stop_at=time.time() - 1, log=lambda *_: None)
    assert (summary["status"], summary["steps"]) == ("stopped", 0)
    assert not (tmp_path / "warm" / "checkpoints").exists()


def test_the_plan_counts_what_fits_from_measured_rows():
    jobs = [Job("a", s, 10, "b0") for s in range(4)] + [Job("x", 0, 10, "b0")]
    rows = [StepRow("gpu", "st", "a", 2.0, start_s=5.0, warm_start_s=30.0, packed=2)]
    packed = [{"kind": "packed", "device": "gpu", "speedup": {"2": 1.6, "4": 2.0}}]
    result = plan("st", jobs, "gpu", 120.0 + budget.REPORT_RESERVE_S, 2, {"b0"}, 0, rows, packed)
    # Two at a time, 1.6x: a packed step is 2 / 1.6 = 1.25x a lone one. The row was
    # measured with 2 packed (2.0 s), so a lone step is 1.6 s, and 2.0 s here again.
    # The base: 30 x 1.25 = 37.5 s on process 1; each run 5 + 10 x 2 = 25 s, to the
    # earliest free process: 0-25, 25-50 (process 2), 37.5-62.5 (1), 50-75 (2).
    assert (len(result.finish), len(result.stop), len(result.not_started)) == (4, 0, 1)
    assert result.unknown == ["x"] and result.speedup == 1.6
    tight = plan("st", jobs, "gpu", 60.0 + budget.REPORT_RESERVE_S, 2, {"b0"}, 0, rows, packed)
    # Deadline 60: 0-25 and 25-50 finish; 37.5-62.5 starts (its start and 3 steps,
    # 48.5 s, fit) and stops at a checkpoint; at 50 the next would need 61 s: not started.
    assert (len(tight.finish), len(tight.stop), len(tight.not_started)) == (2, 1, 2)
    assert "2 finish, 1 stop at a checkpoint" in tight.text()


def test_the_cli_refuses_foreign_bases_and_a_budget_too_small(tmp_path, capsys, monkeypatch):
    definition = tmp_path / "slot.json"
    definition.write_text(json.dumps({"name": "slot", "base": {"preset": "moe-grpo", "set": TINY},
                                      "seeds": [0], "variants": [{"name": "moe"}]}))  # fmt: skip
    code = cli_main(["study", str(definition), "--out", str(tmp_path / "o"), "--budget-s", "5"])
    assert code == BAD_INPUT_EXIT_CODE and "--budget-s" in capsys.readouterr().err
    code = cli_main(["study", str(definition), "--out", str(tmp_path / "o"), "--bases", "/nope"])
    assert code == BAD_INPUT_EXIT_CODE and "no such folder" in capsys.readouterr().err
    code = cli_main(["study", str(definition), "--out", str(tmp_path / "o"), "--dry",
                     "--budget-s", "100", "--device", "NVIDIA H200"])  # fmt: skip
    assert code == 0 and "plan on NVIDIA H200" in capsys.readouterr().out


@pytest.mark.slow
def test_a_study_refuses_bases_of_another_environment_before_any_run(tmp_path, monkeypatch):
    cfg = validate_config(apply_overrides(preset_dict("moe-grpo"), TINY))
    key, _, device = _base(cfg)
    weights = export_base(cfg, key, device, tmp_path / "bases")
    manifest = json.loads(weights.with_suffix(".json").read_text())
    manifest["environment"]["capability"] = "sm80"
    manifest["environment"]["device_type"] = "cuda"
    weights.with_suffix(".json").write_text(json.dumps(manifest))
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "bare"))
    study = StudyDefinition.from_dict({"name": "slot", "base": {"preset": "moe-grpo", "set": TINY},
                                       "seeds": [0], "variants": [{"name": "moe"}]})  # fmt: skip
    with pytest.raises(FieldError, match=r"--bases.*cuda-sm80-float32"):
        run_study(study, tmp_path / "out", bases_dir=tmp_path / "bases")
    assert not list(Path(tmp_path / "out").glob("moe/seed0/summary.json"))
