"""An experiment's runs table (in-process): the hyperparameters that differ as default
columns, summary metrics (last values), sorting with missing values last, MLflow's
filter grammar over lab and external runs alike, a bad filter named on the page, the
CSV, and the parallel-coordinates figure of the same rows."""

from __future__ import annotations

import csv
import io

import pytest
from conftest import records
from mlflow_rest import Mlflow

pytestmark = pytest.mark.slow


@pytest.fixture
def table_runs(make_run, experiment, user):
    lab = [
        make_run(variant="lr-hi", seed=s, overrides={"optim.lr": 1e-3},
                 records=records(5, reward__accuracy=lambda t, s=s: 0.1 * t + 0.05 * s))
        for s in (0, 1)
    ] + [make_run(variant="lr-lo", seed=0, overrides={"optim.lr": 2e-4},
                  records=records(5, reward__accuracy=lambda t: 0.9))]  # fmt: skip
    ml = Mlflow(user)
    external = ml.run(str(experiment.pk), "trl")
    ml.ok("POST", "runs/log-batch", {
        "run_id": external,
        "params": [{"key": "learning_rate", "value": "1e-6"}],
        "metrics": [{"key": "reward/accuracy", "value": 0.3, "timestamp": 1, "step": 1}],
    })  # fmt: skip
    return lab, int(external)


def _table(client, experiment, **params):
    html = client.get(f"/experiments/{experiment.pk}/table", params).content.decode()
    body = html.split("data-runs-table>")[1].split("</table>")[0]
    header = body.split("</thead>")[0]
    rows = [r.split('data-run="')[1].split('"')[0] for r in body.split("<tr ")[1:]]
    return html, header, [int(r) for r in rows]


def test_columns_sorting_and_filtering(alice, experiment, table_runs):
    lab, external = table_runs
    html, header, order = _table(alice, experiment)
    assert "optim.lr" in header and "reward/accuracy" in header
    assert "model.n_layers" not in header  # the same in every run: not a default column
    assert sorted(order) == sorted([r.pk for r in lab] + [external])
    _, _, by_accuracy = _table(alice, experiment, sort="metric:reward/accuracy", order="desc")
    assert by_accuracy == [lab[2].pk, lab[1].pk, lab[0].pk, external]  # 0.9, 0.45, 0.4, 0.3
    _, _, ascending = _table(alice, experiment, sort="param:optim.lr", order="asc")
    assert ascending[0] == lab[2].pk and ascending[-1] == external  # no optim.lr: last
    _, _, kept = _table(alice, experiment, filter="params.`optim.lr` = '0.001'")
    assert sorted(kept) == [lab[0].pk, lab[1].pk]
    _, _, kept = _table(
        alice, experiment, filter="metrics.`reward/accuracy` > 0.35 and tags.seed = '0'"
    )
    assert kept == [lab[0].pk, lab[2].pk]
    _, _, kept = _table(alice, experiment, filter="params.learning_rate != '1'")
    assert kept == [external]  # a run lacking the param does not match !=
    html, _, everything = _table(alice, experiment, filter="metrics.x LIKE 'y'")
    assert 'data-field="filter-error"' in html and len(everything) == 4


def test_csv_and_parallel_coordinates(alice, experiment, table_runs):
    lab, external = table_runs
    got = alice.get(
        f"/experiments/{experiment.pk}/table",
        {"params": "optim.lr,learning_rate", "metrics": "reward/accuracy", "format": "csv"},
    )
    rows = list(csv.reader(io.StringIO(got.content.decode())))
    assert rows[0] == ["run", "variant", "seed", "status", "steps", "collapse step",
                       "optim.lr", "learning_rate", "reward/accuracy"]  # fmt: skip
    by_run = {int(r[0]): r for r in rows[1:]}
    assert by_run[external][7] == "1e-6" and by_run[external][6] == ""
    assert float(by_run[lab[2].pk][8]) == pytest.approx(0.9)
    figure = alice.get(
        f"/experiments/{experiment.pk}/parallel",
        {"params": "optim.lr,stabilizers.replay.mode", "metrics": "reward/accuracy",
         "color": "reward/accuracy"},
    ).json()["figure"]  # fmt: skip
    (trace,) = figure["data"]
    assert trace["type"] == "parcoords"
    labels = [d["label"] for d in trace["dimensions"]]
    assert labels == ["optim.lr", "stabilizers.replay.mode", "reward/accuracy"]
    assert len(trace["dimensions"][0]["values"]) == 4
    mode = trace["dimensions"][1]
    assert "(none)" in mode["ticktext"]  # the external run has no such field
    assert alice.get(f"/experiments/{experiment.pk}/table", {"metrics": 'a"b'}).status_code == 400
