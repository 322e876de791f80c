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


def test_submit_builtin_study_queues_every_variant_and_seed(admin):
    out = _submit("--study", "quick", "--set", "run.steps=3")
    runs = Run.objects.all()
    assert "27 runs queued" in out and runs.count() == 27
    sweep = runs.first().sweep
    assert sweep.study["name"] == "quick" and sweep.seeds == [0, 1, 2]
    variants = set(runs.values_list("variant", flat=True))
    assert {"dense-grpo", "moe-grpo-r3", "moe-ppo"} <= variants and len(variants) == 9
    r3 = runs.filter(variant="moe-grpo-r3", seed=1).get()
    assert r3.config["stabilizers"]["routing_replay"] == "r3" and r3.total_steps == 3
    assert runs.get(variant="dense-grpo", seed=0).config["model"]["n_experts"] == 0


def test_submit_bad_study_names_the_variant_and_stores_nothing(admin, tmp_path):
    path = tmp_path / "study.json"
    path.write_text(
        json.dumps(
            {
                "base": {"preset": "moe-grpo"},
                "variants": [{"name": "big", "set": ["model.top_k=99"]}],
            }
        )
    )
    with pytest.raises(SystemExit) as info:
        _submit("--study", str(path))
    assert info.value.code == 2
    assert not Run.objects.exists()
