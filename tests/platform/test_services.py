"""Services: config resolution, run lifecycle, sweeps, metrics storage."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.utils import timezone
from lab_processes import submit_tiny_run
from teams import share

from lab.configs import resolve_config
from lab.jobs import queries
from lab.jobs import services as jobs
from lab.runs import comments, lifecycle, sweeps
from lab.runs.metrics import read
from lab.runs.metrics.ingest import drop_metrics_after, ingest_metrics
from lab.runs.metrics.seal import seal_metrics
from lab.runs.models import MetricStep, Run, RunStatus
from trainer.errors import FieldError

# What the database itself decides (docs/design.md 4): also run on PostgreSQL.
pytestmark = pytest.mark.database


def _finish(*run_list: Run, sealed: bool) -> int:
    """Make the runs final, their metrics kept as columns or not (a run finished
    before columns existed); returns the queries a metric read of them takes:
    one for the columns, one for the rows past them, whatever the runs."""
    Run.objects.filter(pk__in=[r.pk for r in run_list]).update(status=RunStatus.SUCCEEDED)
    if sealed:
        for run in run_list:
            seal_metrics(run.pk)
    return 2


sealed_or_not = pytest.mark.parametrize("sealed", [False, True], ids=["rows", "columns"])


def test_resolve_config_names_field_paths():
    with pytest.raises(FieldError) as exc:
        resolve_config({"run": {"steps": "ten"}, "model": {"bogus": 1}})
    paths = dict(exc.value.errors)
    assert "config.run.steps" in paths
    assert "config.model.bogus" in paths


def test_submit_run_stores_resolved_config(user, experiment):
    run = submit_tiny_run(user, experiment, queue="cpu", priority=3)
    assert run.status == RunStatus.QUEUED
    assert run.config["run"]["steps"] == 3
    assert run.total_steps == 3
    assert run.config["model"]["n_experts"] == 8  # preset applied, full config stored
    assert run.run_dir.endswith(f"run-{run.pk:06d}")
    assert run.task_id


@pytest.mark.parametrize(
    "kwargs, path",
    [
        ({"overrides": {"run.steps": -1}}, "config.run.steps"),
        ({"overrides": {"algorithm.name": "reinforce"}}, "config.algorithm.name"),
        ({"overrides": {"nope.x": 1}}, "config.nope"),
        ({"queue": "tpu"}, "queue"),
        ({"priority": 12}, "priority"),
        ({"preset": "no-such"}, "preset"),
    ],
)
def test_bad_input_stores_nothing(user, experiment, kwargs, path):
    kwargs = {"preset": "moe-grpo", **kwargs}
    with pytest.raises(FieldError) as exc:
        lifecycle.submit_run(owner=user, experiment=experiment, **kwargs)
    assert any(p == path or p.startswith(path + ".") for p, _ in exc.value.errors), exc.value.errors
    assert Run.objects.count() == 0


def test_cancel_queued_run_never_starts(user, experiment):
    run = submit_tiny_run(user, experiment)
    run = lifecycle.cancel_run(run, user=user)
    assert run.status == RunStatus.CANCELLED and run.finished_at
    assert jobs.claim_run(run.pk, worker_host="w1") is None


def test_cancel_running_run_sets_the_flag_the_worker_polls(user, experiment):
    run = submit_tiny_run(user, experiment)
    claim = jobs.claim_run(run.pk, worker_host="w1")
    assert jobs.stop_requested(claim) == ""
    run = lifecycle.cancel_run(run, user=user)
    assert run.status == RunStatus.RUNNING
    assert jobs.stop_requested(claim) == "cancel"


def test_only_owner_or_staff_cancel_or_delete(user, other_user, staff_user, experiment):
    run = submit_tiny_run(user, experiment)
    with pytest.raises(lifecycle.NotAllowed):
        lifecycle.cancel_run(run, user=other_user)
    with pytest.raises(lifecycle.NotAllowed):
        lifecycle.delete_run(run, user=other_user)
    assert lifecycle.cancel_run(run, user=staff_user).status == RunStatus.CANCELLED
    lifecycle.delete_run(run, user=user)
    assert not Run.objects.filter(pk=run.pk).exists()


def test_running_run_cannot_be_deleted(user, experiment):
    run = submit_tiny_run(user, experiment)
    jobs.claim_run(run.pk, worker_host="w1")
    with pytest.raises(lifecycle.InvalidState):
        lifecycle.delete_run(run, user=user)


def test_claim_is_atomic_and_a_second_delivery_exits(user, experiment):
    run = submit_tiny_run(user, experiment)
    first = jobs.claim_run(run.pk, worker_host="w1", gpu_index="0")
    second = jobs.claim_run(run.pk, worker_host="w2")
    assert first == jobs.Claim(run.pk, 1)
    assert second is None
    run.refresh_from_db()
    assert (run.status, run.worker_host, run.gpu_index, run.attempts) == ("running", "w1", "0", 1)


def test_finish_and_heartbeat_are_fenced_by_attempt(user, experiment):
    run = submit_tiny_run(user, experiment)
    claim = jobs.claim_run(run.pk, worker_host="w1")
    assert jobs.heartbeat(claim, current_step=2)
    stale = jobs.Claim(run.pk, claim.attempt - 1)
    assert not jobs.heartbeat(stale)
    assert not jobs.finish_run(stale, status="failed", summary=None)
    assert jobs.finish_run(claim, status="succeeded", summary={"status": "succeeded"})
    run.refresh_from_db()
    assert run.status == "succeeded" and run.current_step == 2
    assert not jobs.heartbeat(claim)  # finished: the worker must stop


def _age_heartbeat(run_id: int, seconds: float) -> None:
    Run.objects.filter(pk=run_id).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def test_reconciler_requeues_stale_runs_then_fails_after_max_attempts(
    user, experiment, django_capture_on_commit_callbacks
):
    run = submit_tiny_run(user, experiment)
    Run.objects.filter(pk=run.pk).update(max_attempts=2)
    claim = jobs.claim_run(run.pk, worker_host="w1")
    assert jobs.reconcile_stale_runs(60) == []  # fresh heartbeat: left alone
    _age_heartbeat(run.pk, 120)
    with django_capture_on_commit_callbacks() as published:
        actions = jobs.reconcile_stale_runs(60)
    assert [(a.run_id, a.action) for a in actions] == [(run.pk, "requeued")]
    assert len(published) == 1  # a new wake-up goes to the broker after commit
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.task_id != ""
    assert not jobs.heartbeat(claim)  # the old attempt has lost the run

    claim2 = jobs.claim_run(run.pk, worker_host="w2")
    assert claim2.attempt == 2
    _age_heartbeat(run.pk, 120)
    actions = jobs.reconcile_stale_runs(60)
    assert [(a.run_id, a.action) for a in actions] == [(run.pk, "failed")]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "worker lost 2 times" in run.error


def test_sweep_preview_counts_and_validates_every_combination(user, experiment):
    base = experiment.base_config
    grid = {"stabilizers.replay.mode": ["none", "r3"], "algorithm.name": ["grpo", "gspo"]}
    planned = sweeps.preview_sweep(base, grid, [0, 1, 2])
    assert len(planned) == 12
    assert {cfg.run.seed for _, cfg in planned} == {0, 1, 2}
    with pytest.raises(FieldError) as exc:
        sweeps.preview_sweep(base, {"algorithm.name": ["grpo", "sgd"]}, [0])
    assert exc.value.errors[0][0] == "grid.algorithm.name"


def test_create_sweep_is_all_or_nothing(user, experiment):
    base = experiment.base_config
    with pytest.raises(FieldError):
        sweeps.create_sweep(
            owner=user, experiment=experiment, base_config=base,
            grid={"run.steps": [3, 0]}, seeds=[0],
        )  # fmt: skip
    assert Run.objects.count() == 0
    sweep = sweeps.create_sweep(
        owner=user, experiment=experiment, base_config=base,
        grid={"stabilizers.replay.mode": ["none", "r3"]}, seeds=[0, 1], queue="cpu",
    )  # fmt: skip
    assert sweep.runs.count() == 4
    assert sorted(sweep.runs.values_list("variant", flat=True)) == [
        "stabilizers.replay.mode=none", "stabilizers.replay.mode=none",
        "stabilizers.replay.mode=r3", "stabilizers.replay.mode=r3",
    ]  # fmt: skip


def test_sweep_labels_name_only_the_varied_fields_by_their_dotted_paths():
    """The issue's example: a field given one value (run.steps) is in no label."""
    runs = sweeps.expand_grid(
        {"model.n_experts": [4, 8], "model.top_k": [1], "stabilizers.replay.mode": ["none"],
         "run.steps": [400]},
        seeds=[0],
    )  # fmt: skip
    assert [label for label, _ in runs] == ["model.n_experts=4", "model.n_experts=8"]
    assert runs[0][1] == {"model.n_experts": 4, "model.top_k": 1,
                          "stabilizers.replay.mode": "none", "run.steps": 400, "run.seed": 0}  # fmt: skip
    assert sweeps.expand_grid({"run.steps": [30]}, seeds=[0, 1])[0][0] == "base"


def _lines(steps, layers=2):
    return [
        {
            "step": s,
            "reward/accuracy": s / 10,
            "policy/loss": -s,
            **{f"experts/load/L{i}": [0.5, 0.25, 0.25] for i in range(layers)},
        }
        for s in steps
    ]


def test_metrics_ingestion_is_idempotent_per_step(user, experiment):
    run = submit_tiny_run(user, experiment)
    assert ingest_metrics(run.pk, _lines(range(5))) == 5
    assert ingest_metrics(run.pk, _lines(range(3, 8))) == 5  # overlap re-read
    assert ingest_metrics(run.pk, [{"no": "step"}, {"step": "x"}]) == 0
    steps = list(MetricStep.objects.filter(run=run).values_list("step", flat=True))
    assert steps == list(range(8))


@sealed_or_not
def test_metric_series_reads_keys_and_range_in_one_read(
    user, experiment, django_assert_num_queries, sealed
):
    run = submit_tiny_run(user, experiment)
    ingest_metrics(run.pk, _lines(range(100)))
    with django_assert_num_queries(_finish(run, sealed=sealed)):
        data = read.metric_series(
            run.pk, ["reward/accuracy", "experts/load/L1", "missing/key"], start=10, end=19
        )
    assert data["steps"] == list(range(10, 20))
    assert data["series"]["reward/accuracy"] == pytest.approx([s / 10 for s in range(10, 20)])
    assert data["series"]["experts/load/L1"][0] == [0.5, 0.25, 0.25]
    assert data["series"]["missing/key"] == [None] * 10


def test_metric_series_thins_to_max_points_and_keeps_the_last_step(user, experiment):
    run = submit_tiny_run(user, experiment)
    ingest_metrics(run.pk, _lines(range(1000), layers=0))
    data = read.metric_series(run.pk, ["policy/loss"], max_points=64)
    assert len(data["steps"]) <= 64
    assert data["steps"][0] == 0 and data["steps"][-1] == 999
    assert data["steps"] == sorted(set(data["steps"]))


@sealed_or_not
def test_metric_series_keeps_every_keys_extremes_in_one_read(
    user, experiment, django_assert_num_queries, sealed
):
    run = submit_tiny_run(user, experiment)
    lines = [{"step": s, "a": 0.0, "b": 1.0} for s in range(1000)]
    lines[337]["a"], lines[338]["b"] = 5.0, -7.0  # one-step spikes, one per key
    ingest_metrics(run.pk, lines)
    with django_assert_num_queries(_finish(run, sealed=sealed)):
        data = read.metric_series(run.pk, ["a", "b"], max_points=40)
    assert len(data["steps"]) <= 40
    assert data["steps"][0] == 0 and data["steps"][-1] == 999
    assert max(v for v in data["series"]["a"] if v is not None) == 5.0
    assert min(v for v in data["series"]["b"] if v is not None) == -7.0
    ranged = read.metric_series(run.pk, ["a"], start=500, end=599, max_points=10)
    assert ranged["steps"][0] == 500 and ranged["steps"][-1] == 599 and len(ranged["steps"]) <= 10


def test_drop_metrics_after_removes_rewound_steps(user, experiment):
    run = submit_tiny_run(user, experiment)
    ingest_metrics(run.pk, _lines(range(10)))
    assert drop_metrics_after(run.pk, 6) == 3
    assert MetricStep.objects.filter(run=run).count() == 7


def test_queue_position_orders_by_priority_then_age(user, experiment):
    a = submit_tiny_run(user, experiment)
    b = submit_tiny_run(user, experiment)
    c = submit_tiny_run(user, experiment, priority=5)
    assert [queries.queue_position(r) for r in (c, a, b)] == [1, 2, 3]
    lifecycle.cancel_run(a, user=user)
    b.refresh_from_db()
    assert queries.queue_position(b) == 2


def test_clone_run_applies_changes(user, other_user, experiment):
    run = submit_tiny_run(user, experiment)
    share(experiment, other_user)  # a teammate clones alice's run
    clone = lifecycle.clone_run(run, owner=other_user, overrides={"stabilizers.replay.mode": "r3"})
    assert clone.owner == other_user
    assert clone.config["stabilizers"]["replay"]["mode"] == "r3"
    assert clone.config["run"]["steps"] == 3


def test_comment_needs_a_body(user, experiment):
    run = submit_tiny_run(user, experiment)
    with pytest.raises(FieldError):
        comments.add_comment(author=user, body="   ", run=run)
    comment = comments.add_comment(author=user, body="<b>collapsed at 40</b>", run=run)
    assert comment.body == "<b>collapsed at 40</b>"


@sealed_or_not
def test_metric_series_many_skips_missing_keys_and_keeps_stored_nulls(
    user, experiment, django_assert_num_queries, sealed
):
    """A key a step did not log is no point at all; a stored null (NaN/inf in the
    trainer) is a NaN point, where a chart breaks the line."""
    a, b = submit_tiny_run(user, experiment), submit_tiny_run(user, experiment)
    ingest_metrics(
        a.pk,
        [
            {"step": 0, "eval/accuracy": 0.1, "reward/mean": 1.0},
            {"step": 1, "reward/mean": 2.0},
            {"step": 2, "eval/accuracy": None, "reward/mean": 3.0},
            {"step": 3, "eval/accuracy": 0.4, "experts/load/L0": [0.5, 0.5]},
        ],
    )
    with django_assert_num_queries(_finish(a, b, sealed=sealed)):
        data = read.metric_series_many(
            [a.pk, b.pk], ["eval/accuracy", "reward/mean", "experts/load/L0"], start=0, end=3
        )
    assert data[a.pk].steps.tolist() == [0, 1, 2, 3]
    steps, values = data[a.pk].series["eval/accuracy"]
    assert steps.tolist() == [0, 2, 3]
    assert values[0] == 0.1 and math.isnan(values[1]) and values[2] == 0.4
    assert data[a.pk].series["reward/mean"][0].tolist() == [0, 1, 2]
    assert data[a.pk].series["experts/load/L0"][0].tolist() == [3]
    assert data[a.pk].series["experts/load/L0"][1] == [[0.5, 0.5]]
    assert data[b.pk].steps.size == 0 and data[b.pk].series["reward/mean"][0].size == 0


def test_placement_text_says_where_the_run_stands(user, experiment):
    run = submit_tiny_run(user, experiment, queue="cpu")
    assert queries.placement_text(run) == "position 1 in cpu · attempt 0/3"
    claim = jobs.claim_run(run.pk, worker_host="w1", gpu_index="0")
    jobs.heartbeat(claim, current_step=1)
    Run.objects.filter(pk=run.pk).update(
        started_at=timezone.now() - timedelta(seconds=10), cancel_requested=True
    )
    run.refresh_from_db()
    text = queries.placement_text(run)
    assert text.startswith("queue cpu · worker w1 GPU 0 · attempt 1/3 · ETA ")
    assert text.endswith(" s · cancelling…")
