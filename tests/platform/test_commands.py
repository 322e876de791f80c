"""Management commands: submit (config file, preset, sweep) and lab_user."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from lab.experiments.models import Experiment
from lab.runs.models import Run


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
        (
            [
                "--preset",
                "text-grpo",
                "--set",
                "task.verifier=python",
                "--set",
                "task.reward_function=os:popen",
            ],
            "config.task.reward_function",
        ),
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
                "grid": {"stabilizers.replay.mode": ["none", "r3"]},
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
    user = get_user_model().objects.get(username="demo")
    assert user.check_password("s3cret")
    assert not user.is_superuser and not user.is_staff  # ordinary unless asked for


def test_lab_user_superuser_only_when_asked(db):
    call_command("lab_user", "--username", "root", "--superuser", stdout=StringIO())
    user = get_user_model().objects.get(username="root")
    assert user.is_superuser and user.is_staff


def test_lab_user_token_only_never_changes_an_existing_user(db):
    """The command docs/integrations.md gives for a token once demoted an admin and
    reset the password (is_superuser and is_staff set to False)."""
    users = get_user_model().objects
    admin = users.create_superuser("boss", password="keep-me")
    hash_before = admin.password
    out = StringIO()
    call_command("lab_user", "--username", "boss", "--token-only", stdout=out)
    token = out.getvalue().strip()
    admin.refresh_from_db()
    assert admin.is_superuser and admin.is_staff and admin.password == hash_before
    assert admin.check_password("keep-me") and len(token) == 40
    again = StringIO()
    call_command("lab_user", "--username", "boss", "--token-only", stdout=again)
    assert again.getvalue().strip() == token  # the same token, not a new one
    for extra in (["--password", "x"], ["--superuser"]):
        with pytest.raises(CommandError) as info:
            call_command(
                "lab_user", "--username", "boss", "--token-only", *extra, stdout=StringIO()
            )
        assert info.value.returncode == 2 and "never changes an existing user" in str(info.value)
    admin.refresh_from_db()
    assert admin.is_superuser and admin.check_password("keep-me")


def test_lab_user_reset_keeps_rights_and_promotes_only_on_request(db):
    users = get_user_model().objects
    users.create_superuser("boss", password="old")
    call_command("lab_user", "--username", "boss", "--password", "new", stdout=StringIO())
    boss = users.get(username="boss")
    assert boss.check_password("new") and boss.is_superuser and boss.is_staff  # not demoted
    users.create_user("eve", password="pw")
    call_command("lab_user", "--username", "eve", "--superuser", stdout=StringIO())
    assert users.get(username="eve").is_superuser


@pytest.mark.parametrize("name", ["", "x" * 200, "bad name!"])
def test_lab_user_bad_username_exits_2(db, name):
    with pytest.raises(CommandError) as info:
        call_command("lab_user", "--username", name, stdout=StringIO())
    assert info.value.returncode == 2 and str(info.value).startswith("--username:")
    assert not get_user_model().objects.exists()


def test_submit_builtin_study_queues_every_variant_and_seed(admin):
    out = _submit("--study", "quick", "--set", "run.steps=3", "--force")
    runs = Run.objects.all()
    assert "27 runs queued" in out and runs.count() == 27
    sweep = runs.first().sweep
    assert sweep.study["name"] == "quick" and sweep.seeds == [0, 1, 2]
    variants = set(runs.values_list("variant", flat=True))
    assert {"dense-grpo", "moe-grpo-r3", "moe-ppo"} <= variants and len(variants) == 9
    r3 = runs.filter(variant="moe-grpo-r3", seed=1).get()
    assert r3.config["stabilizers"]["replay"]["mode"] == "r3" and r3.total_steps == 3
    assert runs.get(variant="dense-grpo", seed=0).config["model"]["n_experts"] == 0


@pytest.mark.parametrize(("study", "runs", "variant"), [("dose", 60, "moe-grpo-r3-fp8"),
                                                      ("fixes", 70, "moe-grpo-icepop")])  # fmt: skip
def test_submit_dose_and_fixes_studies_as_sweeps(admin, study, runs, variant):
    out = _submit("--study", study, "--force")
    assert f"{runs} runs queued" in out and Run.objects.count() == runs
    run = Run.objects.get(variant=variant, seed=4)
    assert run.config["rollout"]["precision"] == "fp8"
    # An IS correction divides by the rollout's log-probs itself, so its ratio
    # is taken against the trainer's (a ratio already over the rollout's is refused).
    behaviour = "train" if "icepop" in variant else "rollout"
    assert run.config["algorithm"]["behavior_logprobs"] == behaviour


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


def test_submit_study_refuses_a_set_that_redefines_a_variant(admin):
    # --set applies after the variants: model.n_experts would turn dense-grpo into a MoE.
    with pytest.raises(SystemExit) as info:
        _submit("--study", "kl-order", "--set", "model.n_experts=16", "--force")
    assert info.value.code == 2
    assert not Run.objects.exists()


def _live_worker(queue: str) -> None:
    from django.utils import timezone

    from lab.jobs.models import Worker

    Worker.objects.create(hostname=f"{queue}@test", queues=[queue], last_seen=timezone.now())


def test_submit_study_refuses_a_queue_no_live_worker_serves(admin):
    with pytest.raises(CommandError, match=r"No live worker serves gpu-a100.*--force"):
        _submit("--study", "quick", "--queue", "gpu-a100")
    assert not Run.objects.exists() and not Experiment.objects.exists()
    out = _submit("--study", "quick", "--queue", "gpu-a100", "--force")
    assert "27 runs queued" in out and "warning: No live worker serves gpu-a100" in out


def test_submitting_a_study_twice_makes_a_new_experiment_or_says_it_adds_seeds(admin):
    _live_worker("cpu")
    first = _submit("--study", "quick", "--set", "run.steps=3")
    second = _submit("--study", "quick", "--set", "run.steps=3")
    assert "'Stability study: quick'" in first and "'Stability study: quick (2)'" in second
    assert Experiment.objects.count() == 2
    again = _submit(
        "--study", "quick", "--set", "run.steps=3", "--experiment", "Stability study: quick"
    )
    assert "adds seeds: the experiment already held 27 study runs" in again
