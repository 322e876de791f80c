"""Rights (docs/platform.md "Rights"): every write, through the API, the forms
and the dashboard's review actions, for an outsider and for each allowed role."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from lab_processes import TINY_OVERRIDES, submit_tiny_run
from rest_framework.test import APIClient
from teams import share

from dashboard.review.models import BaselinePin, Verdict
from lab.experiments.models import Sweep
from lab.runs.models import Comment, Run


@pytest.fixture
def staff_api(staff_user):
    client = APIClient()
    client.force_authenticate(staff_user)
    return client


def _login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _post(client, url, payload, method="post"):
    return getattr(client, method)(url, json.dumps(payload), content_type="application/json")


def _run_payload(experiment, **extra):
    return {"experiment": experiment.pk, "preset": "moe-grpo", "overrides": TINY_OVERRIDES, **extra}


def _sweep_payload(experiment):
    return {
        "experiment": experiment.pk,
        "preset": "moe-grpo",
        "grid": {"stabilizers.replay.mode": ["none", "r3"]},
        "seeds": [0],
    }


# --------------------------------------------------------------------------- queueing (API)
def test_an_outsider_cannot_queue_runs_sweeps_or_clones_in_someone_elses_experiment(
    api, other_api, experiment
):
    run = submit_tiny_run(experiment.owner, experiment)
    for url, payload in (
        ("/api/runs", _run_payload(experiment)),
        ("/api/sweeps", _sweep_payload(experiment)),
        (f"/api/runs/{run.pk}/clone", {}),
    ):
        response = _post(other_api, url, payload)
        assert response.status_code == 403, (url, response.content)
        assert "shared with" in response.json()["detail"]
    assert Run.objects.count() == 1 and Sweep.objects.count() == 0


def test_the_owner_a_shared_group_and_staff_may_queue(api, other_api, staff_api, experiment):
    assert _post(api, "/api/runs", _run_payload(experiment)).status_code == 201
    assert _post(staff_api, "/api/runs", _run_payload(experiment)).status_code == 201
    share(experiment, experiment.owner, *_users("bob"))
    assert _post(other_api, "/api/runs", _run_payload(experiment)).status_code == 201
    assert _post(other_api, "/api/sweeps", _sweep_payload(experiment)).status_code == 201


def _users(*names):
    from django.contrib.auth import get_user_model

    return list(get_user_model().objects.filter(username__in=names))


def test_priority_above_the_bound_needs_staff(api, staff_api, experiment, settings):
    settings.LAB_MAX_USER_PRIORITY = 5
    response = _post(api, "/api/runs", _run_payload(experiment, priority=9))
    assert response.status_code == 400
    assert "LAB_MAX_USER_PRIORITY" in response.json()["errors"]["priority"][0]
    assert _post(api, "/api/runs", _run_payload(experiment, priority=5)).status_code == 201
    made = _post(staff_api, "/api/runs", _run_payload(experiment, priority=9))
    assert made.status_code == 201 and made.json()["priority"] == 9
    # a user's clone of a staff run keeps the priority only up to the bound
    clone = _post(api, f"/api/runs/{made.json()['id']}/clone", {})
    assert clone.status_code == 201 and clone.json()["priority"] == 5


# --------------------------------------------------------------------------- sharing
def test_only_the_owner_or_staff_change_sharing_and_only_to_their_groups(
    api, other_api, staff_api, user, other_user, experiment
):
    url = f"/api/experiments/{experiment.pk}"
    mine = Group.objects.create(name="alice-team")
    mine.user_set.add(user)
    Group.objects.create(name="elsewhere")
    assert _post(other_api, url, {"shared_with": ["alice-team"]}, "patch").status_code == 403
    refused = _post(api, url, {"shared_with": ["elsewhere"]}, "patch")
    assert refused.status_code == 400 and "elsewhere" in refused.json()["errors"]["shared_with"][0]
    done = _post(api, url, {"shared_with": ["alice-team"]}, "patch")
    assert done.status_code == 200 and done.json()["shared_with"] == ["alice-team"]
    assert _post(staff_api, url, {"shared_with": ["elsewhere"]}, "patch").json()["shared_with"] == [
        "elsewhere"
    ]
    assert _post(api, url, {"shared_with": "alice-team"}, "patch").status_code == 400


def test_sharing_page_edits_for_the_owner_and_refuses_an_outsider(user, other_user, experiment):
    team = Group.objects.create(name="alice-team")
    team.user_set.add(user, other_user)
    url = f"/experiments/{experiment.pk}/sharing"
    outsider = _login(other_user)
    assert outsider.get(url).status_code == 200  # everyone may see whom it is shared with
    refused = outsider.post(url, {"groups": ["alice-team"]})
    assert refused.status_code == 403 and "owner or staff" in refused.content.decode()
    assert not experiment.shared_with.exists()
    owner = _login(user)
    assert 'value="alice-team"' in owner.get(url).content.decode()
    assert owner.post(url, {"groups": ["alice-team"]}).status_code == 302
    assert list(experiment.shared_with.values_list("name", flat=True)) == ["alice-team"]
    # bob is now a member: the run form queues for him
    form = _login(other_user).post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "queue": "cpu", "config_json": json.dumps({"run": {"steps": 2}})},
    )
    assert form.status_code == 302 and Run.objects.get().owner == other_user


# --------------------------------------------------------------------------- forms
def test_run_and_sweep_forms_show_an_outsider_an_inline_error(other_user, experiment):
    browser = _login(other_user)
    page = browser.post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "queue": "cpu", "config_json": json.dumps({"run": {"steps": 2}})},
    )
    assert page.status_code == 200 and "shared with" in page.content.decode()
    sweep = browser.post(
        f"/experiments/{experiment.pk}/sweeps/new",
        {"field_0": "stabilizers.replay.mode", "values_0": "none, r3", "seeds": "0",
         "queue": "cpu", "action": "create"},
    )  # fmt: skip
    assert sweep.status_code == 200 and "shared with" in sweep.content.decode()
    assert Run.objects.count() == 0 and Sweep.objects.count() == 0


def test_run_form_refuses_a_priority_above_the_bound_inline(user, experiment, settings):
    settings.LAB_MAX_USER_PRIORITY = 3
    page = _login(user).post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "queue": "cpu", "priority": "7",
         "config_json": json.dumps({"run": {"steps": 2}})},
    )  # fmt: skip
    assert page.status_code == 200 and "LAB_MAX_USER_PRIORITY" in page.content.decode()
    assert Run.objects.count() == 0


# --------------------------------------------------------------------------- review actions
def test_verdicts_pins_and_unpins_need_membership(user, other_user, staff_user, experiment):
    run = submit_tiny_run(user, experiment)
    outsider = _login(other_user)
    assert outsider.post(f"/runs/{run.pk}/verdict", {"label": "stable"}).status_code == 403
    assert outsider.post(f"/runs/{run.pk}/pin").status_code == 403
    assert not Verdict.objects.exists() and not BaselinePin.objects.exists()
    # the owner pins; an outsider cannot unpin it
    assert _login(user).post(f"/runs/{run.pk}/pin").status_code == 302
    assert outsider.post(f"/experiments/{experiment.pk}/unpin").status_code == 403
    assert BaselinePin.objects.filter(run=run).exists()
    # staff may, and so may a member of a shared group
    staff = _login(staff_user)
    assert staff.post(f"/runs/{run.pk}/verdict", {"label": "stable"}).status_code == 302
    share(experiment, other_user)
    assert outsider.post(f"/runs/{run.pk}/verdict", {"label": "collapsed"}).status_code == 302
    assert outsider.post(f"/experiments/{experiment.pk}/unpin").status_code == 302
    assert Verdict.objects.filter(run=run).count() == 2 and not BaselinePin.objects.exists()


def test_anyone_logged_in_may_comment(other_api, other_user, experiment):
    run = submit_tiny_run(experiment.owner, experiment)
    assert _post(other_api, f"/api/runs/{run.pk}/comments", {"body": "seed 2?"}).status_code == 201
    page = _login(other_user).post(f"/runs/{run.pk}/", {"body": "looks fine"})
    assert page.status_code == 302
    assert Comment.objects.filter(author=other_user).count() == 2


# --------------------------------------------------------------------------- limits
def test_a_model_over_the_deployment_limit_is_refused_naming_the_setting(api, experiment):
    huge = {"model.n_experts": 512, "model.n_layers": 64}
    response = _post(api, "/api/runs", _run_payload(experiment, overrides=huge))
    assert response.status_code == 400
    message = response.json()["errors"]["model"][0]
    assert "parameters exceed this deployment's limit of 2.0B (LAB_MAX_MODEL_PARAMS)" in message
    assert Run.objects.count() == 0


def test_the_run_form_shows_the_model_limit_inline(user, experiment, settings):
    settings.LAB_MAX_MODEL_PARAMS = 10_000
    page = _login(user).post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "queue": "cpu", "config_json": json.dumps({"run": {"steps": 2}})},
    )
    assert page.status_code == 200 and "LAB_MAX_MODEL_PARAMS" in page.content.decode()


def test_queued_runs_per_user_are_capped(api, experiment, settings):
    settings.LAB_MAX_QUEUED_RUNS_PER_USER = 2
    for _ in range(2):
        assert _post(api, "/api/runs", _run_payload(experiment)).status_code == 201
    third = _post(api, "/api/runs", _run_payload(experiment))
    assert third.status_code == 400
    assert "LAB_MAX_QUEUED_RUNS_PER_USER" in third.json()["errors"]["__all__"][0]
    assert _post(api, "/api/sweeps", _sweep_payload(experiment)).status_code == 400
    assert Run.objects.count() == 2 and Sweep.objects.count() == 0


def test_sweep_size_is_capped_by_the_setting(api, experiment, settings):
    settings.LAB_MAX_SWEEP_RUNS = 3
    payload = _sweep_payload(experiment) | {"seeds": [0, 1]}
    response = _post(api, "/api/sweeps", payload)
    assert response.status_code == 400
    assert "LAB_MAX_SWEEP_RUNS" in response.json()["errors"]["grid"][0]
    assert Run.objects.count() == 0


def test_the_cli_refuses_an_outsider_with_a_message(other_user, experiment):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="shared with"):
        call_command(
            "submit", "--preset", "moe-grpo", "--experiment", str(experiment.pk), "--user", "bob"
        )
    assert Run.objects.count() == 0


def test_the_run_page_offers_pin_and_verdict_only_to_whom_may(user, other_user, experiment):
    run = submit_tiny_run(user, experiment)
    url = f"/runs/{run.pk}/"
    mine = _login(user).get(url).content.decode()
    assert "Record verdict" in mine and "Pin as the experiment" in mine
    theirs = _login(other_user).get(url).content.decode()
    assert "Record verdict" not in theirs and "Pin as the experiment" not in theirs
    assert f"/experiments/{experiment.pk}/sharing" in theirs
