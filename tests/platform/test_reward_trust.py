"""Reward code is trusted code: the web process never imports or calls a reward
function, and a run may name only one the administrator offers
(``LAB_REWARD_MODULES``). The review's payloads (``shutil:rmtree`` on a folder,
``os:popen`` running a command, ``os:execlp`` replacing the server's process)
are submitted by an ordinary user through the API and the run form and shown to
run nothing. ``os:execlp`` is sent only to a real server in its own process
(``test_the_payloads_run_nothing_on_a_real_server``): had it run inside the test
process, it would have replaced pytest with /bin/true, which exits 0.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

import pytest
from django.test import Client, override_settings
from lab_processes import LabStack
from reward_modules import write_reward_module

from lab.jobs.spawn import trainer_env
from lab.runs.models import Run
from lab.runs.sweeps import create_study_sweep
from trainer.errors import FieldError

FIELD = "config.task.reward_function"


@pytest.fixture
def traps(tmp_path, monkeypatch):
    """What each payload would have done, had the web process called it on the
    data file's answers while checking the config (as it once did):

    * ``shutil:rmtree(answer, answer)``: delete the folder the answer names;
    * ``os:popen("r", "r")``: run the command ``r``, here a script on PATH that
      writes a marker file;
    * ``os:execlp("/bin/true", "/bin/true")``: replace the process.
    """
    victim = tmp_path / "victim"
    (victim / "inside").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "popen-ran"
    script = bin_dir / "r"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def data(answer: str) -> str:
        path = tmp_path / f"data-{abs(hash(answer))}.jsonl"
        rows = [{"question": f"what is {i}?", "answer": answer} for i in range(12)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    payloads = {
        "shutil:rmtree": data(str(victim)),
        "os:popen": data("r"),
        "os:execlp": data("/bin/true"),
    }
    return victim, marker, payloads


def _config(data_file: str, function: str) -> dict:
    return {
        "task": {
            "name": "text",
            "data_file": data_file,
            "verifier": "python",
            "reward_function": function,
        },
        "run": {"steps": 2},
    }


def _nothing_ran(victim: Path, marker: Path) -> None:
    assert (victim / "inside").is_dir(), "the folder was deleted"
    assert not marker.exists(), "the command ran"


# --------------------------------------------------------------------------- in this process
@pytest.mark.parametrize("function", ["shutil:rmtree", "os:popen"])
def test_the_api_refuses_the_payloads_and_nothing_runs(api, experiment, traps, function):
    victim, marker, payloads = traps
    response = api.post(
        "/api/runs",
        {"experiment": experiment.pk, "config": _config(payloads[function], function)},
        format="json",
    )
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert list(errors) == [FIELD]
    assert "not a reward function this lab offers" in errors[FIELD][0]
    _nothing_ran(victim, marker)
    assert not Run.objects.exists()


@pytest.mark.parametrize("function", ["shutil:rmtree", "os:popen"])
def test_the_form_refuses_the_payloads_inline_and_nothing_runs(user, experiment, traps, function):
    victim, marker, payloads = traps
    browser = Client()
    browser.login(username="alice", password="pw-alice")
    url = f"/experiments/{experiment.pk}/runs/new"
    # The JSON editor of the form ...
    config = _config(payloads[function], function)
    page = browser.post(url, {"mode": "json", "queue": "cpu", "config_json": json.dumps(config)})
    assert page.status_code == 200 and not Run.objects.exists()
    text = page.content.decode()
    assert re.search(r'id="f-task.reward_function"[^>]*aria-invalid="true"', text) or (
        "not a reward function this lab offers" in text
    )
    # ... and its fields.
    fields = {
        "mode": "form", "queue": "cpu", "task.name": "text",
        "task.data_file": payloads[function], "task.verifier": "python",
        "task.reward_function": function, "run.steps": "2",
    }  # fmt: skip
    page = browser.post(url, fields)
    assert page.status_code == 200 and not Run.objects.exists()
    text = page.content.decode()
    field = text.split('id="f-task.reward_function"')[1].split("</div>")[0]
    assert "not a reward function this lab offers" in field, field[:2000]
    _nothing_ran(victim, marker)


def test_staff_name_only_offered_functions_too(staff_user, experiment, traps):
    from rest_framework.test import APIClient

    victim, marker, payloads = traps
    client = APIClient()
    client.force_authenticate(staff_user)
    response = client.post(
        "/api/runs",
        {"experiment": experiment.pk, "config": _config(payloads["os:popen"], "os:popen")},
        format="json",
    )
    assert response.status_code == 400 and FIELD in response.json()["errors"]
    _nothing_ran(victim, marker)


def test_an_offered_function_is_queued_without_being_imported(
    api, experiment, tmp_path, monkeypatch
):
    marker = tmp_path / "imported"
    monkeypatch.setenv("REWARD_MARKER", str(marker))
    module = write_reward_module(
        tmp_path / "mods",
        "lab_offered_rewards",
        """
        import os, pathlib
        pathlib.Path(os.environ["REWARD_MARKER"]).touch()
        def score(response, answer):
            return float(answer in response)
        """,
        monkeypatch,
    )
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(12))
    )
    with override_settings(LAB_REWARD_MODULES=(module,)):
        response = api.post(
            "/api/runs",
            {"experiment": experiment.pk, "config": _config(str(data), f"{module}:score")},
            format="json",
        )
        assert response.status_code == 201, response.content
        run = Run.objects.get()
        assert run.config["task"]["reward_function"] == f"{module}:score"
        assert not marker.exists() and module not in sys.modules
        # The worker hands the same list to the trainer, which enforces it too.
        assert trainer_env(1)["LAB_REWARD_MODULES"] == module
    assert trainer_env(1)["LAB_REWARD_MODULES"] == ""


def test_a_study_sweep_names_only_offered_functions(user, experiment, traps):
    _, _, payloads = traps
    task = _config(payloads["os:popen"], "os:popen")["task"]
    definition = {
        "name": "s",
        "base": {
            "preset": "text-grpo",
            "set": [f"task.{k}={json.dumps(v)}" for k, v in task.items()],
        },
        "variants": [{"name": "a"}],
        "seeds": [0],
    }
    with pytest.raises(FieldError) as info:
        create_study_sweep(owner=user, experiment=experiment, definition=definition)
    assert info.value.errors[0][0] == "variants.a.task.reward_function"
    assert not Run.objects.exists()


# --------------------------------------------------------------------------- a real server
def _worker_pids(master: int) -> set[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return {int(pid) for pid in children}


@pytest.mark.e2e
@pytest.mark.slow
def test_the_payloads_run_nothing_on_a_real_server(tmp_path, traps):
    victim, marker, payloads = traps
    stack = LabStack(tmp_path / "stack", "filesystem")  # gunicorn, as deployed
    try:
        experiment = stack.post("/api/experiments", {"name": "trust", "preset": "moe-grpo"})
        master = stack.procs["web"].pid
        workers = _worker_pids(master)
        assert workers
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        base = f"http://127.0.0.1:{stack.port}"

        def form_post(path: str, fields: dict) -> str:
            page = opener.open(base + path).read().decode()
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
            body = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": token}).encode()
            request = urllib.request.Request(base + path, body, headers={"Referer": base + path})
            return opener.open(request).read().decode()

        form_post("/accounts/login/", {"username": "e2e", "password": "pw"})
        for function, data_file in payloads.items():
            config = _config(data_file, function)
            code, body = stack.request(
                "POST", "/api/runs", {"experiment": experiment["id"], "config": config}
            )
            assert code == 400 and list(body["errors"]) == [FIELD], (code, body)
            page = form_post(
                f"/experiments/{experiment['id']}/runs/new",
                {"mode": "json", "queue": stack.queue, "config_json": json.dumps(config)},
            )
            assert "not a reward function this lab offers" in page
        _nothing_ran(victim, marker)
        assert _worker_pids(master) == workers, "a web worker was replaced or died"
        assert stack.get("/api/runs")["count"] == 0
    finally:
        stack.close()
