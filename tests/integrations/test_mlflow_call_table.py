"""The MLflow call table (tests/mlflow_call_table.py) with the real ``mlflow`` client,
against a live lab and against a real ``mlflow server`` (SQLite backend, proxied
artifacts) as the reference: every row must answer the same on both. What the
lab makes of such runs (seeds, variants, nested runs, deleted runs, step counts)
is tested in-process in tests/platform/test_tracking_grouping.py."""

from __future__ import annotations

import json
import os

import pytest

mlflow = pytest.importorskip("mlflow")

from lab_processes import LabStack  # noqa: E402
from mlflow_call_table import call_table  # noqa: E402
from mlflow_server import MlflowServer, mlflow_server_available  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not mlflow_server_available(), reason="needs the full mlflow package"),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    stack = LabStack(tmp_path_factory.mktemp("call-table-lab"), "filesystem")
    yield stack
    stack.close()


def _table(uri: str, token: str, work) -> dict:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_TRACKING_TOKEN", token)
        for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_RUN_ID",
                     "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):  # fmt: skip
            env.delenv(name, raising=False)
        env.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        try:
            return call_table(uri, work)
        finally:
            while mlflow.active_run() is not None:
                mlflow.end_run()
            mlflow.set_tracking_uri(None)
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)


@pytest.fixture(scope="module")
def tables(lab, tmp_path_factory):
    reference_root = tmp_path_factory.mktemp("call-table-mlflow")
    server = MlflowServer(reference_root / "server")
    try:
        reference = _table(server.uri, "unused", reference_root)
    finally:
        server.close()
    ours = _table(f"http://127.0.0.1:{lab.port}", lab.token, tmp_path_factory.mktemp("ct-work"))
    return reference, ours


def test_every_call_answers_as_a_real_mlflow_server(tables):
    reference, ours = tables
    assert set(ours) == set(reference)
    differ = {
        row: {"mlflow": reference[row], "lab": ours[row]}
        for row in reference
        if reference[row] != ours[row]
    }
    assert not differ, json.dumps(differ, indent=1)
    assert len(reference) > 100  # the table is the review's, not a sample
    # a few rows that say what the table covers, read from the reference's answers
    assert reference["runs.search filter=params.lr != '0.001'"] == ["R3", "r2"]  # r4, r5 lack lr
    assert reference["runs.search order=['metrics.reward DESC']"][0] == "trial1"
    assert reference["metrics.history two points at one step"] == [
        [3, 0.25, 10], [3, 0.75, 20], [4, 0.5, 30],
    ]  # fmt: skip
