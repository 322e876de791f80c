"""Management commands: submit (config file, preset, sweep) and lab_user."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from runs.models import Run


@pytest.fixture
def admin(db):
    return get_user_model().objects.create_superuser("root", password="pw")


def _submit(*args):
    out = StringIO()
    call_command("submit", *args, stdout=out, stderr=out)
    return out.getvalue()


def test_submit_preset_with_overrides(admin):
    out = _submit("--preset", "moe-grpo", "--set", "run.steps=4", "--queue", "cpu")
    run = Run.objects.get()
    assert f"run {run.pk} queued" in out
    assert run.total_steps == 4 and run.owner == admin


def test_submit_config_file(admin, tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"model": {"n_experts": 0}, "run": {"steps": 5}}))
    _submit("--config", str(path), "--experiment", "dense baseline")
    run = Run.objects.get()
    assert run.config["model"]["n_experts"] == 0
    assert run.experiment.name == "dense baseline"


@pytest.mark.parametrize(
    "args, path",
    [
        (["--preset", "moe-grpo", "--set", "run.steps=oops"], "config.run.steps"),
        (["--preset", "moe-grpo", "--set", "model.colour=1"], "config.model.colour"),
        (["--preset", "moe-grpo", "--queue", "tpu"], "queue"),
        (["--config", "/no/such/file.json"], "--config"),
    ],
)
def test_submit_bad_input_exits_2_and_stores_nothing(admin, capsys, args, path):
    out = StringIO()
    with pytest.raises(SystemExit) as exc:
        call_command("submit", *args, stdout=out, stderr=out)
    assert exc.value.code == 2
    assert f"  {path}:" in out.getvalue()
    assert Run.objects.count() == 0


def test_submit_sweep(admin, tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text(
        json.dumps(
            {
                "name": "replay",
                "preset": "moe-grpo",
                "grid": {"stabilizers.routing_replay": ["none", "r3"]},
                "seeds": [0, 1],
            }
        )
    )
    out = _submit("--sweep", str(path), "--set", "run.steps=3")
    assert "4 runs queued" in out
    assert {r.total_steps for r in Run.objects.all()} == {3}


def test_lab_user_prints_credentials(db):
    out = StringIO()
    call_command("lab_user", "--username", "demo", "--password", "s3cret", stdout=out)
    assert "user demo  password s3cret  api token " in out.getvalue()
    assert get_user_model().objects.get(username="demo").check_password("s3cret")
