"""Custom reward functions: never imported by building a task or validating a config,
run in their own process with a time bound per call, and only from the list the
environment offers (trainer/reward_functions.py, trainer/tasks/reward_process.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reward_modules import write_reward_module

from trainer.errors import FieldError
from trainer.reward_functions import ENV_VAR, parse_entries, parse_reward_path, permit
from trainer.tasks import make_task
from trainer.tasks.reward_process import RewardFunctionError, RewardProcess
from trainer.tasks.verifiers import PythonVerifier, make_verifier
from trainer.validation import validate_config

REWARDS = """
import os, pathlib, time
from shutil import rmtree  # imported, not defined here: never a reward function

pathlib.Path(os.environ["REWARD_MARKER"]).write_text(str(os.getpid()))

def contains(response, answer):
    return 1.0 if answer in response else 0.25

def slow_on_hang(response, answer):
    if response == "hang":
        time.sleep(60)
    return 1.0 if answer in response else 0.0

def boom(response, answer):
    raise RuntimeError("no score for " + response)

def words(response, answer):
    return "yes"

def as_bool(response, answer):
    return answer in response

def not_finite(response, answer):
    return float("nan") if response == "nan" else float("inf")

def leave(response, answer):
    os._exit(3)
"""


@pytest.fixture
def rewards(tmp_path, monkeypatch):
    """The module's name; importing it writes REWARD_MARKER (so a test sees whether,
    and in which process, it was imported)."""
    marker = tmp_path / "imported"
    monkeypatch.setenv("REWARD_MARKER", str(marker))
    monkeypatch.delenv(ENV_VAR, raising=False)
    name = write_reward_module(tmp_path / "mods", "lab_test_rewards", REWARDS, monkeypatch)
    yield name
    sys.modules.pop(name, None)


def _marker() -> Path:
    return Path(os.environ["REWARD_MARKER"])


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(12))
    )
    return path


def _text_config(tmp_path: Path, function: str, **task) -> dict:
    return {
        "task": {
            "name": "text",
            "data_file": str(_data(tmp_path)),
            "verifier": "python",
            "reward_function": function,
            **task,
        }
    }


# --------------------------------------------------------------------------- the names
def test_reward_paths_are_identifiers_only():
    assert str(parse_reward_path("a.b:c")) == "a.b:c"
    assert str(parse_reward_path("a.b.c")) == "a.b:c"
    for bad in ("os", ":f", "a:", "a b:c", "/tmp/x.py:f", "a:b.c", "a:__import__", "a;b:c"):
        with pytest.raises(ValueError):
            parse_reward_path(bad)
    assert parse_entries(" a.rewards, b.m:score ,\n") == ("a.rewards", "b.m:score")
    with pytest.raises(ValueError, match="neither"):
        parse_entries("a.rewards, ../x")


def test_the_list_permits_a_module_s_functions_or_one_function():
    entries = ("labrewards", "other.mod:score")
    assert permit("labrewards:exact", entries).module_entry
    assert not permit("other.mod:score", entries).module_entry
    for name in ("other.mod:other", "shutil:rmtree", "os:popen", "os:execlp", "labrewards.sub:f"):
        with pytest.raises(ValueError, match="not a reward function this lab offers"):
            permit(name, entries)
    with pytest.raises(ValueError, match="offers none"):
        permit("os:popen", ())


# --------------------------------------------------------------------------- never imported by building
def test_validating_a_config_imports_and_calls_nothing(tmp_path, rewards):
    cfg = validate_config(_text_config(tmp_path, f"{rewards}:contains"))
    task = make_task(cfg.task)
    assert task.space_size() > 0 and task.max_target_len > 0  # rows read, targets built
    assert not _marker().exists() and rewards not in sys.modules


def test_a_bad_name_is_a_field_error_without_an_import(tmp_path):
    with pytest.raises(FieldError) as info:
        validate_config(_text_config(tmp_path, "not a path"))
    assert info.value.errors[0][0] == "task.reward_function"


# --------------------------------------------------------------------------- its own process
def test_the_function_runs_in_its_own_process_and_scores(tmp_path, rewards):
    verifier = make_verifier("python", function=f"{rewards}:contains", timeout_s=5)
    assert isinstance(verifier, PythonVerifier)
    try:
        scores = verifier.score(["it is 42", "it is 41"], ["42", "42"], 0.0)
        assert scores == [(1.0, True), (0.25, False)]
        assert verifier.reward("42", "42", 0.0) == 1.0 and not verifier.is_correct("1", "42")
        child = int(_marker().read_text())
        assert child != os.getpid() and rewards not in sys.modules
    finally:
        verifier.close()


def test_bools_count_and_non_finite_values_score_zero(tmp_path, rewards):
    for name, want in (
        ("as_bool", [(1.0, True), (0.0, False)]),
        ("not_finite", [(0.0, False)] * 2),
    ):
        verifier = make_verifier("python", function=f"{rewards}:{name}", timeout_s=5)
        try:
            assert verifier.score(["x 7", "nan"], ["7", "8"], 0.0) == want
        finally:
            verifier.close()


def test_a_call_over_the_bound_scores_zero_and_the_rest_of_the_batch_is_scored(tmp_path, rewards):
    scorer = RewardProcess(f"{rewards}:slow_on_hang", timeout_s=0.5)
    try:
        scorer.start()
        first = scorer.pid
        t0 = time.monotonic()
        values = scorer.score([("a 1", "1"), ("hang", "1"), ("b 2", "2"), ("c", "3")])
        assert values == [1.0, None, 1.0, 0.0]
        assert time.monotonic() - t0 < 10 and scorer.timeouts == 1
        assert scorer.pid != first  # a fresh process took the rest
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)
    finally:
        scorer.close()


def test_a_function_that_raises_or_leaves_fails_with_the_field(tmp_path, rewards):
    for name, match in (("boom", "raised RuntimeError: no score for x"), ("words", "not a number"),
                        ("leave", "ended mid-call")):  # fmt: skip
        cfg = validate_config(_text_config(tmp_path, f"{rewards}:{name}"))
        task = make_task(cfg.task)
        try:
            task.start()
            with pytest.raises(FieldError, match=match) as info:
                task.score([task.build(0)], ["x"])
            assert info.value.errors[0][0] == "task.reward_function"
        finally:
            task.close()
    with pytest.raises(RewardFunctionError):
        RewardProcess(f"{rewards}:leave", 5).score([("x", "y")])


def test_start_names_what_cannot_load(tmp_path, rewards):
    for name, match in (
        ("no_such_mod_xyz:f", "cannot import"),
        (f"{rewards}:nope", "has no function"),
    ):
        cfg = validate_config(_text_config(tmp_path, name))
        task = make_task(cfg.task)
        with pytest.raises(FieldError, match=match) as info:
            task.start()
        assert info.value.errors[0][0] == "task.reward_function"


# --------------------------------------------------------------------------- the environment's list
def test_with_a_list_only_offered_functions_start(tmp_path, rewards, monkeypatch):
    monkeypatch.setenv(ENV_VAR, rewards)
    scorer = RewardProcess(f"{rewards}:contains", 5)
    try:
        assert scorer.score([("1", "1")]) == [1.0]
    finally:
        scorer.close()
    # Defined elsewhere, imported into the offered module: refused in the child.
    with pytest.raises(ValueError, match="not defined in"):
        RewardProcess(f"{rewards}:rmtree", 5).start()
    _marker().unlink()
    for name in ("shutil:rmtree", "os:popen", "os:execlp"):
        with pytest.raises(ValueError, match="not a reward function this lab offers"):
            RewardProcess(name, 5).start()
    monkeypatch.setenv(ENV_VAR, "")
    with pytest.raises(ValueError, match="offers none"):
        RewardProcess(f"{rewards}:contains", 5).start()
    assert not _marker().exists()  # refused before any process imported it


@pytest.mark.slow
def test_the_trainer_cli_refuses_an_unoffered_function_before_writing(tmp_path, rewards):
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps(_text_config(tmp_path, "os:popen")))
    out = tmp_path / "run"
    env = {**os.environ, ENV_VAR: rewards, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--config", str(config), "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert (
        "task.reward_function" in done.stderr
        and "not a reward function this lab offers" in done.stderr
    )
    assert "Traceback" not in done.stderr and not out.exists() and not _marker().exists()


def test_the_function_s_process_dies_with_the_trainer(tmp_path, rewards):
    script = (
        "import sys, time\n"
        "from trainer.tasks.reward_process import RewardProcess\n"
        f"p = RewardProcess({rewards + ':contains'!r}, 5); p.start()\n"
        "print(p.pid, flush=True); time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the reward function's process outlived its trainer")
    finally:
        parent.kill()


@pytest.mark.slow
def test_a_run_trains_on_an_offered_function_with_a_bound(tmp_path, rewards, monkeypatch):
    """The trainer under a worker's list: the function scores every step (and the
    warm start's held-out checks) in its own process."""
    from trainer.cli import main as cli_main

    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(ENV_VAR, rewards)
    out = tmp_path / "run"
    sets = {
        "task.data_file": str(_data(tmp_path)),
        "task.verifier": "python",
        "task.reward_function": f"{rewards}:slow_on_hang",
        "task.reward_timeout_s": 5,
        "run.steps": 2,
        "run.threads": 1,
        "warm_start.max_steps": 2,
        "rollout.prompts_per_step": 2,
        "rollout.group_size": 2,
    }
    args = ["run", "--preset", "text-grpo", "--out", str(out)]
    for key, value in sets.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    assert cli_main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    assert int(_marker().read_text()) != os.getpid() and rewards not in sys.modules
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all("reward/mean" in json.loads(line) for line in lines)
