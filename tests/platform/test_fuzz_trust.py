"""Fuzz pass with the review's inputs: the API, the MLflow-compatible tracking
endpoints and the TensorBoard import never answer 5xx, and no external run or
import is left running.

Hypothesis draws from the inputs that once broke the lab, mixed with arbitrary
values:

* run configs naming a custom reward function (the review's ``shutil:rmtree``,
  ``os:execlp``, ``os:popen`` and garbage), python verifiers, prompt bounds and
  hostile prompt templates, submitted through ``POST /api/runs`` and
  ``/api/sweeps`` (with Idempotency-Keys);
* MLflow calls (create, log-batch, log-metric, update, get, search,
  get-history, set-tag) with steps at 2^31 - 1, 2^53 - 1 and beyond, negative,
  NaN / Infinity values as MLflow sends them, huge and odd timestamps, junk
  run ids and statuses;
* TensorBoard event folders made from a sound file by truncating it, flipping
  bytes, replacing it with random bytes or an empty file, and scalars that are
  NaN or Inf; each imported with ``final`` true or false.

The reward payloads' data files answer ``/nonexistent/...``: if the web process
ever called the function again, ``os:execlp`` would raise instead of replacing
pytest with /bin/true (which would exit 0 unnoticed), and ``shutil:rmtree`` finds
nothing to delete; the victim folder is checked anyway. The Django test client
re-raises a view's exception, so an unhandled error fails the example as a 500
would. ``LAB_FUZZ_EXAMPLES=N`` hunts longer with fresh random examples.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token

from lab.runs.models import Run, RunOrigin, RunStatus
from lab.tracking.models import ImportStatus, TensorBoardImportJob

pytest.importorskip("tensorboard")
pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("LAB_FUZZ_EXAMPLES", 60))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize="LAB_FUZZ_EXAMPLES" not in os.environ,
    database=None,
)

REWARD_NAMES = [
    "shutil:rmtree", "os:execlp", "os:popen", "os:system", "builtins:eval", "os",
    "a b:c", "/tmp/x.py:f", "pkg.mod:_private", "pkg.mod:fn", "", "x" * 400,
]  # fmt: skip
STEPS = [0, 1, 2**31 - 1, 2**31, 2**53 - 1, 2**53, 2**63 - 1, 2**63, -1, -(2**31)]
VALUES = [0.5, -1e308, 1e308, "NaN", "Infinity", "-Infinity", "nan", None, "x", True]
TEMPLATES = ["{question}", "Q: {question}\nA:", "{question:>10000000}", "{a[0]}", "{", "{0}"]

_answers = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20))
mlflow_values = st.one_of(st.sampled_from(VALUES), st.floats(), st.integers(), st.text(max_size=8))
steps = st.one_of(st.sampled_from(STEPS), st.integers(), st.text(max_size=6), st.none())
timestamps = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64), st.sampled_from([None, "1"])
)


@pytest.fixture
def world(user, experiment, tmp_path, settings):
    """A data file whose answers name nothing, a victim folder, a token client."""
    settings.LAB_REWARD_MODULES = ()
    victim = tmp_path / "victim"
    (victim / "inside").mkdir(parents=True)
    data = tmp_path / "rows.jsonl"
    rows = [{"question": f"q{i}", "answer": f"/nonexistent/{i}"} for i in range(12)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    token = Token.objects.create(user=user).key
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    experiment_id = client.post(
        "/api/2.0/mlflow/experiments/create", json.dumps({"name": "fuzz"}),
        content_type="application/json",
    ).json()["experiment_id"]  # fmt: skip
    return {"client": client, "experiment": experiment, "data": str(data), "victim": victim,
            "tmp": tmp_path, "mlflow_experiment": experiment_id}  # fmt: skip


def _ok(response, what: Any) -> dict:
    assert response.status_code < 500, (what, response.status_code, response.content[:800])
    try:
        return response.json()
    except ValueError:
        return {}


def _nothing_left_running() -> None:
    assert not TensorBoardImportJob.objects.filter(
        status__in=[ImportStatus.QUEUED, ImportStatus.RUNNING]
    ).exists()


# --------------------------------------------------------------------------- the API
@FUZZ
@given(data=st.data())
def test_run_and_sweep_submissions_with_the_reviews_inputs_never_5xx(world, data):
    task: dict[str, Any] = {"name": "text", "data_file": world["data"]}
    if data.draw(st.booleans()):
        task["verifier"] = "python"
        task["reward_function"] = data.draw(
            st.one_of(st.sampled_from(REWARD_NAMES), st.text(max_size=30))
        )
    if data.draw(st.booleans()):
        task["reward_timeout_s"] = data.draw(st.sampled_from([0, -1, 0.001, 10, 601, 1e308, "x"]))
    if data.draw(st.booleans()):
        task["max_prompt_chars"] = data.draw(
            st.sampled_from([None, 0, 1, 131072, 10**6, 10**7, "x"])
        )
    if data.draw(st.booleans()):
        task["prompt_template"] = data.draw(st.sampled_from(TEMPLATES))
    config = {"task": task, "run": {"steps": data.draw(st.sampled_from([1, 2, 0, 2**31]))}}
    key = data.draw(st.sampled_from(["", "k1", "k2", "x" * 201]))
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    client = world["client"]
    if data.draw(st.booleans()):
        body = {"experiment": world["experiment"].pk, "config": config}
        response = client.post(
            "/api/runs", json.dumps(body), content_type="application/json", **headers
        )
    else:
        body = {"experiment": world["experiment"].pk, "base_config": config,
                "grid": {"run.seed": [0, 1]}, "seeds": [0]}  # fmt: skip
        response = client.post(
            "/api/sweeps", json.dumps(body), content_type="application/json", **headers
        )
    answer = _ok(response, body)
    if task.get("verifier") == "python" and isinstance(task.get("reward_function"), str):
        # No reward function is offered here: a python verifier is never stored.
        assert response.status_code in (400, 422), answer
    assert (world["victim"] / "inside").is_dir()


# --------------------------------------------------------------------------- MLflow
@FUZZ
@given(data=st.data())
def test_mlflow_calls_with_the_reviews_inputs_never_5xx(world, data):
    client = world["client"]

    def call(route: str, body: dict, method: str = "POST") -> dict:
        if method == "GET":
            response = client.get(f"/api/2.0/mlflow/{route}", body)
        else:
            response = client.post(
                f"/api/2.0/mlflow/{route}", json.dumps(body), content_type="application/json"
            )
        return _ok(response, (route, body))

    created = call("runs/create", {"experiment_id": world["mlflow_experiment"],
                                   "start_time": data.draw(timestamps), "run_name": data.draw(st.text(max_size=10))})  # fmt: skip
    run_id = created.get("run", {}).get("info", {}).get("run_id") or data.draw(st.text(max_size=5))
    for _ in range(data.draw(st.integers(1, 4))):
        route = data.draw(st.sampled_from(["log-batch", "log-metric", "update", "get", "search",
                                           "get-history", "set-tag"]))  # fmt: skip
        if route == "log-batch":
            metrics = data.draw(st.lists(st.fixed_dictionaries({
                "key": st.sampled_from(["loss", "critic/score/mean", "x" * 300, ""]),
                "value": mlflow_values, "timestamp": timestamps, "step": steps}), max_size=4))  # fmt: skip
            call("runs/log-batch", {"run_id": run_id, "metrics": metrics})
        elif route == "log-metric":
            call("runs/log-metric", {"run_id": run_id, "key": "loss", "value": data.draw(mlflow_values),
                                     "timestamp": data.draw(timestamps), "step": data.draw(steps)})  # fmt: skip
        elif route == "update":
            call("runs/update", {"run_id": run_id, "status": data.draw(st.sampled_from(
                ["RUNNING", "FINISHED", "FAILED", "KILLED", "LOST", "", "x"])), "end_time": data.draw(timestamps)})  # fmt: skip
        elif route == "get":
            call("runs/get", {"run_id": run_id}, "GET")
        elif route == "search":
            call("runs/search", {"experiment_ids": [world["mlflow_experiment"]],
                                 "max_results": data.draw(st.sampled_from([1, 0, -1, 10**9, "x"]))})  # fmt: skip
        elif route == "get-history":
            call("metrics/get-history", {"run_id": run_id, "metric_key": "loss",
                                         "max_results": data.draw(st.sampled_from(["1", "0", "-5", "x"]))}, "GET")  # fmt: skip
        else:
            call("runs/set-tag", {"run_id": run_id, "key": data.draw(st.text(max_size=10)),
                                  "value": data.draw(st.text(max_size=10))})  # fmt: skip
    # End what was started (a client that sends nothing more would become lost): every
    # run of this example then stands in a status the review can read.
    call("runs/update", {"run_id": run_id, "status": "FINISHED"})


# --------------------------------------------------------------------------- TensorBoard
def _sound_events(folder: Path, values: list[float]) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    for step, value in enumerate(values):
        writer.add_scalar("train/reward", value, step)
    writer.close()
    (path,) = folder.glob("*tfevents*")
    return path


@FUZZ
@given(data=st.data())
def test_tensorboard_imports_of_broken_files_never_5xx_nor_stay_running(world, data):
    n = next(_folders)
    folder = world["tmp"] / f"tb{n}"
    values = data.draw(
        st.lists(
            st.sampled_from([0.1, 0.5, math.nan, math.inf, -math.inf, 1e38]),
            min_size=0,
            max_size=30,
        )
    )
    path = _sound_events(folder, values)
    raw = bytearray(path.read_bytes())
    damage = data.draw(st.sampled_from(["none", "truncate", "flip", "random", "empty", "header"]))
    if damage == "truncate" and raw:
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    elif damage == "flip" and raw:
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] ^= data.draw(st.integers(1, 255))
    elif damage == "random":
        raw = bytearray(data.draw(st.binary(min_size=0, max_size=2000)))
    elif damage == "empty":
        raw = bytearray()
    elif damage == "header":
        raw = bytearray(struct.pack("<Q", 2**62)) + raw[8:]
    path.write_bytes(bytes(raw))
    final = data.draw(st.booleans())
    body = {"experiment_id": world["mlflow_experiment"], "path": str(folder), "final": final}
    answer = _ok(
        world["client"].post(
            "/api/tracking/tensorboard", json.dumps(body), content_type="application/json"
        ),
        (damage, values),
    )
    assert answer["import_status"] in ("succeeded", "failed"), answer
    run = Run.all_objects.get(pk=answer["run_id"])
    if final or answer["import_status"] == "failed":
        assert run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED), (damage, answer)
    if answer["import_status"] == "failed":
        assert answer["error"] and answer["points"] == 0
    _nothing_left_running()
    if not final and run.status == RunStatus.RUNNING:  # followed: the next call ends it
        again = _ok(world["client"].post("/api/tracking/tensorboard", json.dumps(
            {"run_id": str(run.pk), "path": str(folder)}), content_type="application/json"), "again")  # fmt: skip
        assert again["import_status"] in ("succeeded", "failed")
        run.refresh_from_db()
        assert run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED)
    assert not Run.all_objects.filter(
        pk=run.pk, origin=RunOrigin.EXTERNAL, status=RunStatus.RUNNING
    ).exists()


_folders = iter(range(10**9))
