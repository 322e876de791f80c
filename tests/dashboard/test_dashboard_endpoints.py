"""Chart endpoints: downsampled with the spike kept, zoom at full resolution,
CSV/JSON downloads, heatmaps, status, parameter errors."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest

from lab.runs.models import RunStatus
from tests.dashboard.conftest import payload_traces, plotly_array, records
from trainer.metric_keys import metric_spec

N_STEPS = 5000
SPIKE_STEP = 3217
SPIKE = 0.5
# KL is drawn in the registry's display unit, ×1e-3 (trainer/metric_keys.py).
KL_SHOWN = metric_spec("mismatch/kl_k3").scale


def kl(step: int) -> float:
    """Small, smooth KL with one spike: what a stability study must not lose."""
    return SPIKE if step == SPIKE_STEP else 1e-3 * (1 + 0.1 * math.sin(step / 50))


@pytest.fixture
def long_run(make_run):
    return make_run(
        records=records(N_STEPS, mismatch__kl_k3=kl, reward__accuracy=lambda s: s / N_STEPS),
        status=RunStatus.RUNNING,
    )


def test_run_chart_downsampled_keeps_the_spike(alice, long_run):
    response = alice.get(f"/runs/{long_run.pk}/chart", {"key": "mismatch/kl_k3", "max_points": 200})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["running"] is True
    assert body["figure"]["layout"]["uirevision"] == "mismatch/kl_k3"
    (trace,) = payload_traces(response)
    assert trace["meta"]["role"] == "run"
    assert len(trace["x"]) <= 200
    assert trace["y"].max() == pytest.approx(SPIKE * KL_SHOWN)  # drawn ×1e-3
    assert SPIKE_STEP in trace["x"].astype(int).tolist()
    assert trace["x"][0] == 0 and trace["x"][-1] == N_STEPS - 1


def test_zoom_window_is_full_resolution(alice, long_run):
    response = alice.get(
        f"/runs/{long_run.pk}/chart",
        {"key": "mismatch/kl_k3", "max_points": 500, "start": 3200, "end": 3300},
    )
    (trace,) = payload_traces(response)
    # every step of the window, plus one neighbour outside each edge
    assert trace["x"].astype(int).tolist() == list(range(3199, 3302))
    np.testing.assert_allclose(trace["y"], [kl(s) * KL_SHOWN for s in range(3199, 3302)])


def _csv_rows(response) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(response.content.decode())))


def test_csv_download_is_full_resolution_unless_max_points(alice, long_run):
    url = f"/runs/{long_run.pk}/chart"
    response = alice.get(url, {"key": "mismatch/kl_k3", "format": "csv"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert 'attachment; filename="run-' in response["Content-Disposition"]
    rows = _csv_rows(response)
    assert len(rows) == N_STEPS
    assert rows[SPIKE_STEP]["x"] == str(SPIKE_STEP)
    assert float(rows[SPIKE_STEP]["y"]) == pytest.approx(SPIKE * KL_SHOWN)
    thinned = _csv_rows(
        alice.get(url, {"key": "mismatch/kl_k3", "format": "csv", "max_points": 50})
    )
    assert len(thinned) <= 50
    assert max(float(r["y"]) for r in thinned) == pytest.approx(SPIKE * KL_SHOWN)


def test_json_download_skips_missing_keys_and_keeps_stored_nulls_as_gaps(alice, make_run):
    run = make_run(
        records=[
            {"step": 0, "reward/accuracy": 0.1},
            {"step": 1, "reward/mean": 0.3},  # not logged at step 1: skipped, no gap
            {"step": 2, "reward/accuracy": 0.3},
            {"step": 3, "reward/accuracy": None},  # a non-finite value, stored as null: a gap
            {"step": 4, "reward/accuracy": 0.5},
        ]
    )
    response = alice.get(f"/runs/{run.pk}/chart", {"key": "reward/accuracy", "format": "json"})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    data = response.json()
    (trace,) = data["traces"]
    assert trace["name"] == f"#{run.pk} none s0"
    assert trace["x"] == [0, 2, 3, 4]
    assert trace["y"] == [0.1, 0.3, None, 0.5]


def test_sparse_metric_is_one_unbroken_line_when_downsampled(alice, make_run):
    """eval/accuracy logged every 10th step: the steps between do not have the key,
    so the drawn series is its 30 points joined, not 300 gaps."""
    run = make_run(
        records=[
            {
                "step": s,
                "reward/accuracy": 0.5,
                **({"eval/accuracy": s / 300} if s % 10 == 0 else {}),
            }
            for s in range(300)
        ]
    )
    for max_points in (500, 8):
        response = alice.get(
            f"/runs/{run.pk}/chart", {"key": "eval/accuracy", "max_points": max_points}
        )
        (trace,) = payload_traces(response)
        x, y = np.asarray(trace["x"]), np.asarray(trace["y"], dtype=float)
        assert len(x) == (30 if max_points == 500 else 8)
        assert np.isfinite(y).all() and x[0] == 0 and x[-1] == 290


def test_compare_chart_overlays_runs_and_marks_collapse(alice, make_run):
    a = make_run(seed=0, records=records(40, reward__accuracy=lambda s: 0.5))
    b = make_run(
        seed=1,
        records=records(40, reward__accuracy=lambda s: 0.4),
        summary={"collapsed": True, "collapse_step": 25, "collapse_reason": "accuracy fell"},
    )
    response = alice.get("/compare/chart", {"runs": f"{a.pk},{b.pk}", "key": "reward/accuracy"})
    traces = payload_traces(response)
    names = [t["name"] for t in traces]
    assert names[:2] == [f"#{a.pk} none s0", f"#{b.pk} none s1"]
    collapse = [t for t in traces if t["meta"]["role"] == "collapse"]
    assert len(collapse) == 1 and collapse[0]["meta"]["reason"] == "accuracy fell"
    assert response.json()["running"] is False
    annotations = response.json()["figure"]["layout"]["annotations"]
    assert any("collapse @ 25" in a["text"] for a in annotations)


def test_compare_chart_draws_the_baseline_distinctly(alice, make_run):
    a = make_run(seed=0, records=records(10, reward__accuracy=lambda s: 0.5))
    b = make_run(seed=1, records=records(10, reward__accuracy=lambda s: 0.6))
    response = alice.get(
        "/compare/chart",
        {"runs": f"{a.pk},{b.pk}", "key": "reward/accuracy", "baseline": b.pk},
    )
    traces = payload_traces(response)
    assert traces[0]["meta"] == {"run": f"#{b.pk} none s1", "role": "baseline"}
    assert traces[0]["line"]["dash"] == "dash"
    assert traces[0]["line"]["color"] == "#111111"
    assert traces[1]["meta"]["role"] == "run"
    assert "dash" not in traces[1]["line"]


def test_experiment_chart_mean_band_and_seed_lines(alice, make_run, experiment):
    for seed, level in enumerate([0.2, 0.4]):
        make_run(
            variant="r3", seed=seed, records=records(30, reward__accuracy=lambda s, v=level: v)
        )
    make_run(variant="none", seed=0, records=records(30, reward__accuracy=lambda s: 0.1))
    response = alice.get(f"/experiments/{experiment.pk}/chart", {"key": "reward/accuracy"})
    traces = payload_traces(response)
    roles = [(t["meta"]["variant"], t["meta"]["role"]) for t in traces]
    assert ("r3", "mean") in roles and ("none", "mean") in roles
    assert roles.count(("r3", "seed")) == 2
    mean = next(t for t in traces if t["meta"] == {"variant": "r3", "role": "mean"})
    np.testing.assert_allclose(mean["y"], 0.3)
    upper = next(t for t in traces if t["meta"] == {"variant": "r3", "role": "band_upper"})
    np.testing.assert_allclose(upper["y"], 0.4)
    std = alice.get(
        f"/experiments/{experiment.pk}/chart", {"key": "reward/accuracy", "band": "std"}
    )
    assert "1 std" in std.json()["figure"]["layout"]["title"]["text"]


def test_heatmap_bins_steps_and_keeps_distributions(alice, make_run):
    def load(step: int) -> list[float]:
        hot = step % 4
        return [0.7 if e == hot else 0.1 for e in range(4)]

    run = make_run(records=records(1000, experts__load__L1=load))
    response = alice.get(f"/runs/{run.pk}/heatmap", {"layer": 1, "max_points": 100})
    (trace,) = payload_traces(response)
    assert trace["type"] == "heatmap"
    assert trace["meta"] == {"layer": 1, "role": "expert_load"}
    z = trace["z"]
    assert z.shape == (4, 100)
    np.testing.assert_allclose(z.sum(axis=0), 1.0)
    zoomed = payload_traces(
        alice.get(f"/runs/{run.pk}/heatmap", {"layer": 1, "start": 10, "end": 19})
    )[0]
    assert zoomed["x"].astype(int).tolist() == list(range(10, 20))
    np.testing.assert_allclose(zoomed["z"][:, 0], load(10))
    empty = alice.get(f"/runs/{run.pk}/heatmap", {"layer": 5}).json()
    assert "no data yet" in empty["figure"]["layout"]["annotations"][0]["text"]
    shared = payload_traces(alice.get(f"/runs/{run.pk}/heatmap", {"layer": 1, "scale": "shared"}))[
        0
    ]
    assert shared["zmax"] == 1.0  # 4 experts: 4 x 25%
    bad = alice.get(f"/runs/{run.pk}/heatmap", {"layer": 1, "scale": "log"})
    assert bad.status_code == 400 and "scale" in bad.json()["errors"]


def test_status_endpoint_reports_progress_and_log_tail(alice, make_run, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    run = make_run(records=records(5, reward__accuracy=lambda s: 0.5), status=RunStatus.RUNNING)
    run_dir = tmp_path / f"run-{run.pk:06d}"
    run_dir.mkdir()
    (run_dir / "trainer.log").write_text("step 1\nstep 2 <b>bold</b>\n")
    run.run_dir = str(run_dir)
    run.save(update_fields=["run_dir"])
    body = alice.get(f"/runs/{run.pk}/status").json()
    assert body["status"] == "running" and body["running"] is True
    assert body["current_step"] == 5  # steps 0-4 stored
    assert body["placement"].endswith("attempt 0/3")
    assert body["log_tail"] == "step 1\nstep 2 <b>bold</b>\n"


def test_log_outside_the_runs_folder_is_not_read(alice, make_run, settings, tmp_path):
    settings.RUNS_DIR = tmp_path / "runs"
    run = make_run()
    (tmp_path / "trainer.log").write_text("secret")
    run.run_dir = str(tmp_path)
    run.save(update_fields=["run_dir"])
    assert alice.get(f"/runs/{run.pk}/status").json()["log_tail"] is None


@pytest.mark.parametrize(
    "query, field",
    [
        ({}, "key"),
        ({"key": "bad key!"}, "key"),
        ({"key": "reward/accuracy", "max_points": 2}, "max_points"),
        ({"key": "reward/accuracy", "max_points": "many"}, "max_points"),
        ({"key": "reward/accuracy", "start": 50, "end": 10}, "start"),
        ({"key": "reward/accuracy", "format": "xml"}, "format"),
    ],
)
def test_bad_parameters_answer_400_naming_the_field(alice, make_run, query, field):
    run = make_run()
    response = alice.get(f"/runs/{run.pk}/chart", query)
    assert response.status_code == 400
    assert field in response.json()["errors"]


def test_unknown_run_is_404(alice, db):
    assert alice.get("/runs/999/chart", {"key": "reward/accuracy"}).status_code == 404


def test_run_without_metrics_draws_a_message(alice, make_run):
    run = make_run(status=RunStatus.QUEUED)
    body = alice.get(f"/runs/{run.pk}/chart", {"key": "reward/accuracy"}).json()
    assert body["running"] is True
    assert "waiting for the first step" in body["figure"]["layout"]["annotations"][0]["text"]


def test_compare_chart_group_answers_each_chart_like_the_single_chart_endpoint(
    alice, client, long_run, make_run
):
    other = make_run(seed=1, records=records(100, mismatch__kl_k3=lambda s: 2e-3))
    runs = f"{long_run.pk},{other.pk}"
    keys = ["mismatch/kl_k3", "reward/accuracy"]
    response = alice.get(
        "/compare/charts", {"runs": runs, "keys": ",".join(keys), "max_points": 200}
    )
    assert response.status_code == 200
    body = response.json()
    assert body["running"] is True and list(body["charts"]) == keys
    for key in keys:
        single = alice.get("/compare/chart", {"runs": runs, "key": key, "max_points": 200})
        assert body["charts"][key] == single.json()
    kl = body["charts"]["mismatch/kl_k3"]["figure"]["data"][0]
    assert len(plotly_array(kl["x"])) <= 200
    assert max(plotly_array(kl["y"])) == pytest.approx(SPIKE * KL_SHOWN)  # the spike survives

    assert alice.get("/compare/charts", {"runs": runs}).status_code == 400
    bad = alice.get("/compare/charts", {"runs": runs, "keys": "a!b"})
    assert bad.status_code == 400 and "keys" in bad.json()["errors"]
    zoomed = alice.get("/compare/charts", {"runs": runs, "keys": "a/b", "start": 5})
    assert zoomed.status_code == 400
    assert client.get("/compare/charts", {"runs": runs, "keys": "a/b"}).status_code == 401


def test_parameter_errors_keep_their_messages(alice, make_run):
    run = make_run()
    url = f"/runs/{run.pk}/chart"
    missing = alice.get(url).json()["errors"]
    assert missing == {"key": ["give a metric key, e.g. key=mismatch/kl_k3"]}
    assert alice.get(url, {"key": "reward/accuracy", "start": "inf"}).json()["errors"] == {
        "start": ["start must be an integer"]
    }
    bad_runs = alice.get("/compare/chart", {"runs": "1,²", "key": "reward/accuracy"})
    assert bad_runs.json()["errors"] == {"runs": ["runs must be run ids separated by commas"]}
