"""Grouping as MLflow teams do it, and what the lab makes of it (in-process): seeds and
variants from tags set after the run started, nested runs as parent and child, soft
delete and restore of runs and experiments (hidden from the lab's pages and API
meanwhile), experiment tags and renames, dataset inputs, exact step counts, and a
collapse reason that names the metric judged."""

from __future__ import annotations

import pytest
from mlflow_rest import Mlflow

from lab.experiments.models import Experiment
from lab.runs.models import Run
from lab.tracking.models import TrackedRun

pytestmark = pytest.mark.slow


@pytest.fixture
def ml(user):
    return Mlflow(user)


@pytest.fixture
def exp_id(ml):
    return ml.ok("POST", "experiments/create", {"name": "grouping"})["experiment_id"]


def _log(ml, run_id, metrics=(), tags=None):
    ml.ok("POST", "runs/log-batch", {
        "run_id": run_id,
        "metrics": [{"key": k, "value": v, "timestamp": 1000 + s, "step": s} for k, v, s in metrics],
        "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()],
    })  # fmt: skip


def test_tags_set_after_the_start_give_the_seed_and_the_variant(ml, exp_id):
    run_id = ml.run(exp_id, "grpo-lr1e-6")
    run = Run.objects.get(pk=run_id)
    assert (run.seed, run.variant) == (0, "grpo-lr1e-6")  # the run name until a tag says
    # transformers' MLflowCallback: start_run, then set_tags(MLFLOW_TAGS)
    _log(ml, run_id, tags={"seed": "3", "lab.variant": "grpo"})
    run.refresh_from_db()
    assert (run.seed, run.variant) == (3, "grpo")
    ml.ok("POST", "runs/update", {"run_id": run_id, "run_name": "renamed"})
    run.refresh_from_db()
    assert run.variant == "grpo"  # the tag still says
    assert ml.ok("GET", "runs/get", {"run_id": run_id})["run"]["info"]["run_name"] == "renamed"
    ml.ok("POST", "runs/delete-tag", {"run_id": run_id, "key": "lab.variant"})
    ml.ok("POST", "runs/set-tag", {"run_id": run_id, "key": "lab.seed", "value": "4"})
    run.refresh_from_db()
    assert (run.seed, run.variant) == (3, "renamed")  # "seed" is read before "lab.seed"


def test_nested_runs_know_their_parent(ml, exp_id):
    parent = ml.run(exp_id, "sweep")
    children = [ml.run(exp_id, f"trial{k}", tags={"mlflow.parentRunId": parent}) for k in range(2)]
    late = ml.run(exp_id, "late")
    _log(ml, late, tags={"mlflow.parentRunId": parent})  # a parent set after the start
    tracked = {t.run_id: t for t in TrackedRun.objects.all()}
    assert [tracked[int(c)].parent_id for c in [*children, late]] == [int(parent)] * 3
    assert tracked[int(parent)].parent_id is None
    found = ml.ok("POST", "runs/search", {
        "experiment_ids": [exp_id], "filter": f"tags.mlflow.parentRunId = '{parent}'",
    })  # fmt: skip
    assert sorted(r["info"]["run_name"] for r in found["runs"]) == ["late", "trial0", "trial1"]


def test_step_counts_are_exact_and_the_reason_names_the_metric_judged(ml, exp_id):
    run_id = ml.run(exp_id, "five")
    # a client logging steps 1..5 (the Hugging Face Trainer's global steps), and a metric
    # at step 0 only (TRL's first generation timing)
    rewards = [0.8, 0.8, 0.0, 0.0, 0.0]
    _log(ml, run_id, [("reward/mean", r, s + 1) for s, r in enumerate(rewards)])
    _log(ml, run_id, [("profiling/gen", 1.0, 0)])
    _log(ml, run_id, [("reward/mean", 0.0, 5)])  # again: no new step
    run = Run.objects.get(pk=run_id)
    assert run.current_step == 6  # steps 0..5 hold metrics
    ml.ok("POST", "runs/update", {"run_id": run_id, "status": "FINISHED"})
    run.refresh_from_db()
    assert run.summary["judged_steps"] == 5
    assert run.summary["collapse_metric"] == "reward/mean"
    if run.summary["collapsed"]:
        assert run.summary["collapse_reason"].startswith("reward/mean ")
    long_id = ml.run(exp_id, "long")
    curve = [0.6] * 30 + [0.05] * 30
    _log(ml, long_id, [("reward/mean", r, s) for s, r in enumerate(curve)])
    ml.ok("POST", "runs/update", {"run_id": long_id, "status": "FINISHED"})
    summary = Run.objects.get(pk=long_id).summary
    assert summary["collapsed"] and summary["collapse_reason"].startswith("reward/mean ")
    assert "reward/accuracy" not in summary["collapse_reason"]


def test_deleted_runs_leave_every_page_until_restored(ml, exp_id, api, user):
    run_id = ml.run(exp_id, "soon gone")
    _log(ml, run_id, [("loss", 1.0, 0)])
    ml.ok("POST", "runs/delete", {"run_id": run_id})
    got = ml.ok("GET", "runs/get", {"run_id": run_id})["run"]["info"]
    assert got["lifecycle_stage"] == "deleted"
    assert not Run.objects.filter(pk=run_id).exists() and Run.all_objects.filter(pk=run_id).exists()
    assert run_id not in [
        str(r["id"]) for r in api.get(f"/api/runs?experiment={exp_id}").json()["results"]
    ]
    assert api.get(f"/api/runs/{run_id}").status_code == 404
    code, data = ml.call("POST", "runs/log-batch", {"run_id": run_id, "metrics": []})
    assert (code, data["error_code"]) == (400, "INVALID_PARAMETER_VALUE")
    assert "deleted" in data["message"]
    ml.ok("POST", "runs/restore", {"run_id": run_id})
    assert api.get(f"/api/runs/{run_id}").status_code == 200
    assert (
        ml.ok("GET", "runs/get", {"run_id": run_id})["run"]["info"]["lifecycle_stage"] == "active"
    )


def test_experiment_tags_rename_delete_and_restore(ml, exp_id, api, other_user):
    kept = ml.run(exp_id, "kept")
    gone_first = ml.run(exp_id, "deleted before")
    ml.ok("POST", "runs/delete", {"run_id": gone_first})
    ml.ok(
        "POST",
        "experiments/set-experiment-tag",
        {"experiment_id": exp_id, "key": "goal", "value": "kl"},
    )
    ml.ok("POST", "experiments/update", {"experiment_id": exp_id, "new_name": "grouping v2"})
    got = ml.ok("GET", "experiments/get", {"experiment_id": exp_id})["experiment"]
    assert got["name"] == "grouping v2" and got["tags"] == [{"key": "goal", "value": "kl"}]
    # someone else may read it but not rename or delete it
    stranger = Mlflow(other_user)
    code, data = stranger.call("POST", "experiments/delete", {"experiment_id": exp_id})
    assert (code, data["error_code"]) == (403, "PERMISSION_DENIED")
    ml.ok("POST", "experiments/delete", {"experiment_id": exp_id})
    assert not Experiment.objects.filter(pk=exp_id).exists()
    assert api.get(f"/api/experiments/{exp_id}").status_code == 404
    assert not Run.objects.filter(pk=kept).exists()
    deleted = ml.ok("GET", "experiments/get", {"experiment_id": exp_id})["experiment"]
    assert deleted["lifecycle_stage"] == "deleted"
    code, _ = ml.call("POST", "runs/create", {"experiment_id": exp_id})
    assert code == 404
    ml.ok("POST", "experiments/restore", {"experiment_id": exp_id})
    assert Run.objects.filter(pk=kept).exists()
    assert not Run.objects.filter(pk=gone_first).exists()  # deleted on its own: stays deleted


def test_dataset_inputs_are_kept_once(ml, exp_id):
    run_id = ml.run(exp_id, "data")
    body = {"run_id": run_id, "datasets": [{
        "dataset": {"name": "gsm8k", "digest": "abc", "source_type": "hf", "source": "{}"},
        "tags": [{"key": "mlflow.data.context", "value": "train"}],
    }]}  # fmt: skip
    ml.ok("POST", "runs/log-inputs", body)
    ml.ok("POST", "runs/log-inputs", body)
    inputs = ml.ok("GET", "runs/get", {"run_id": run_id})["run"]["inputs"]["dataset_inputs"]
    assert [i["dataset"]["name"] for i in inputs] == ["gsm8k"]
    body["datasets"][0]["dataset"]["digest"] = "x" * 37
    code, data = ml.call("POST", "runs/log-inputs", body)
    assert code == 400 and "datasets[0].dataset.digest" in data["message"]
