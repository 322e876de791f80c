"""Recorded verl (0.5, 0.6, 0.7), slime and OpenRLHF streams (tests/framework_streams.py:
the names each logs, read from its source) into the lab, as each framework logs:
verl over MLflow or TensorBoard, slime and OpenRLHF over TensorBoard. A collapse
planted at one RL step is found at that step, and the reward, the entropy and the
mismatch signal are charted at the same steps (slime's train axis aligned with its
rollout axis); every framework's mismatch signal lands under a lab key; names with
``@`` read back; text summaries are listed as not imported, with the reason."""

from __future__ import annotations

import urllib.parse

import pytest
from framework_streams import fixtures, mlflow_batches, write_tensorboard
from mlflow_rest import Mlflow

from lab.runs.metrics.read import metric_series_many
from lab.runs.models import Run
from lab.tracking import metric_map
from lab.tracking.models import TrackedRun
from lab.tracking.tensorboard import TensorBoardImport
from trainer import metric_keys as mk

pytest.importorskip("tensorboard")
pytestmark = pytest.mark.slow

STEPS, COLLAPSE_AT = 60, 30
FIXTURES = fixtures()
MISMATCH_KEY = {
    "verl-0.5.0": mk.MISMATCH_PROB_ABS_DIFF,
    "verl-0.6.0": mk.MISMATCH_KL_K3,
    "verl-0.7.0": mk.MISMATCH_KL_K3,
    "slime-624b824": mk.MISMATCH_LOGP_ABS_DIFF,
    "openrlhf-3c3be62": mk.MISMATCH_KL_K1,
}


def _import(name, fixture, tmp_path, user, experiment) -> Run:
    if fixture["via"] == "mlflow":
        ml = Mlflow(user)
        run_id = ml.run(str(experiment.pk), name, tags={"lab.samples_per_step": "512"})
        for batch in mlflow_batches(fixture, STEPS, COLLAPSE_AT):
            ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": batch})
        ml.ok("POST", "runs/update", {"run_id": run_id, "status": "FINISHED"})
        return Run.objects.get(pk=run_id)
    folder = tmp_path / name
    write_tensorboard(folder, fixture, STEPS, COLLAPSE_AT)
    job = TensorBoardImport.start(user=user, experiment_id=experiment.pk, folder=folder)
    job.poll(user)
    return job.finish(user)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_a_planted_collapse_is_found_at_one_step_on_every_axis(name, tmp_path, user, experiment):
    fixture = FIXTURES[name]
    run = _import(name, fixture, tmp_path, user, experiment)
    assert run.source["framework"] == fixture["framework"]
    assert run.summary["collapsed"], run.summary
    assert run.summary["collapse_step"] == COLLAPSE_AT
    assert run.summary["collapse_metric"] == mk.REWARD_MEAN
    assert run.current_step == STEPS  # RL steps, slime's train steps folded onto them
    keys = [mk.REWARD_MEAN, mk.POLICY_ENTROPY, MISMATCH_KEY[name]]
    series = metric_series_many([run.pk], keys)[run.pk].series
    for key in keys:
        steps, _ = series[key]
        assert steps.tolist() == list(range(STEPS)), key
    reward, entropy = series[mk.REWARD_MEAN][1], series[mk.POLICY_ENTROPY][1]
    # both fall between the same two steps: the step the collapse was planted at
    assert reward[COLLAPSE_AT - 1] > 0.5 > reward[COLLAPSE_AT]
    assert entropy[COLLAPSE_AT - 1] > 0.5 > entropy[COLLAPSE_AT]
    mismatch = series[MISMATCH_KEY[name]][1]
    assert mismatch[COLLAPSE_AT - 6] < mismatch[COLLAPSE_AT - 5]  # it rose five steps before


def test_slime_train_points_keep_their_own_steps(tmp_path, user, experiment):
    fixture = FIXTURES["slime-624b824"]
    run = _import("slime", fixture, tmp_path, user, experiment)
    assert run.source["steps_per_rollout"] == [2, False]
    ml = Mlflow(user)
    history = ml.ok(
        "GET", "metrics/get-history", {"run_id": run.pk, "metric_key": "train/entropy_loss"}
    )
    assert [m["step"] for m in history["metrics"]] == list(range(2 * STEPS))


def test_at_names_are_read_back_and_text_is_listed(tmp_path, user, experiment, api):
    verl = _import("verl", FIXTURES["verl-0.7.0"], tmp_path, user, experiment)
    name = "val-core/openai/gsm8k/reward/mean@1"
    got = api.get(f"/api/runs/{verl.pk}/metrics?" + urllib.parse.urlencode({"keys": name}))
    assert got.status_code == 200, got.content
    assert len(got.json()["series"][name]) == STEPS
    assert TrackedRun.objects.get(run=verl).import_notes == []
    openrlhf = _import("openrlhf", FIXTURES["openrlhf-3c3be62"], tmp_path, user, experiment)
    notes = TrackedRun.objects.get(run=openrlhf).import_notes
    assert [(n["tag"], n["kind"]) for n in notes] == [("train/generated_samples", "text")]
    assert "not a metric" in notes[0]["reason"]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_mapped_name_is_one_the_framework_logs(name):
    fixture = FIXTURES[name]
    table = metric_map.FRAMEWORK_MAPS[fixture["framework"]]
    logged = set(fixture["names"])
    # one version never logs two names for one lab key
    by_key: dict[str, set[str]] = {}
    for logged_name in logged & set(table):
        by_key.setdefault(table[logged_name], set()).add(logged_name)
    assert all(len(names) == 1 for names in by_key.values()), by_key
    # the signals the review reads are mapped in every version
    assert table.get(fixture["signals"]["reward"]) == mk.REWARD_MEAN
    assert table.get(fixture["signals"]["entropy"]) == mk.POLICY_ENTROPY
    assert table.get(fixture["signals"]["mismatch"]) == MISMATCH_KEY[name]


@pytest.mark.parametrize("framework", [metric_map.VERL, metric_map.SLIME, metric_map.OPENRLHF])
def test_every_mapping_was_read_from_a_recorded_version(framework):
    recorded = set().union(*(f["names"] for f in FIXTURES.values() if f["framework"] == framework))
    missing = set(metric_map.FRAMEWORK_MAPS[framework]) - recorded
    assert not missing, f"no recorded {framework} version logs {sorted(missing)}"


def test_the_stability_review_shows_every_frameworks_mismatch(tmp_path, user, experiment):
    from django.test import Client

    for name in sorted(FIXTURES):
        _import(name, FIXTURES[name], tmp_path, user, experiment)
    browser = Client()
    browser.force_login(user)
    table = browser.get("/stability/table", {"experiment": experiment.pk}).json()
    rows = {row["variant"]: row for row in table["rows"]}
    for name in FIXTURES:
        assert rows[name]["kl_kind"] == MISMATCH_KEY[name], name
        assert rows[name]["kl_k3_x1e3"] is not None, name
        assert rows[name]["collapse_step"] == str(COLLAPSE_AT), name
