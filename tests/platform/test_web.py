"""Browser pages: login everywhere, the schema-generated form, escaping, CSRF."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from dashboard.web import schema_form
from lab.runs import comments, lifecycle
from lab.runs.models import Run


@pytest.fixture
def browser(user):
    client = Client()
    client.login(username="alice", password="pw-alice")
    return client


@pytest.fixture
def other_browser(other_user):
    client = Client()
    client.login(username="bob", password="pw-bob")
    return client


@pytest.fixture
def run(user, experiment, tiny):
    return lifecycle.submit_run(
        owner=user, experiment=experiment, preset="moe-grpo", overrides=tiny
    )


PAGES = ["/", "/experiments/", "/queue/", "/workers/"]


@pytest.mark.parametrize("url", PAGES)
def test_pages_need_login(db, url):
    response = Client().get(url)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_detail_pages_need_login(run):
    for url in (f"/runs/{run.pk}/", f"/experiments/{run.experiment_id}/runs/new"):
        response = Client().get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_login_page_and_pages_render(browser, run):
    assert Client().get("/accounts/login/").status_code == 200
    pages = [*PAGES[1:], f"/experiments/{run.experiment_id}/"]
    for url in [*pages, f"/runs/{run.pk}/"]:
        response = browser.get(url)
        assert response.status_code == 200, url
        assert b'<nav class="nav">' in response.content


def test_old_dashboard_urls_redirect_permanently(browser, run):
    """The pages moved from /dashboard/<path> to /<path>; old links follow them,
    a POST keeps its method (308), and no old address redirects off the site."""
    moved = {
        f"/dashboard/runs/{run.pk}/": f"/runs/{run.pk}/",
        f"/dashboard/runs/{run.pk}/?baseline=0": f"/runs/{run.pk}/?baseline=0",
        f"/dashboard/experiments/{run.experiment_id}/": f"/experiments/{run.experiment_id}/",
        "/dashboard/stability/?format=csv": "/stability/?format=csv",
        "/dashboard/": "/",
        "/dashboard//evil.example/": "/evil.example/",
    }
    for old, new in moved.items():
        response = browser.get(old)
        assert response.status_code == 301, old
        assert response["Location"] == new
    posted = browser.post(f"/dashboard/runs/{run.pk}/pin")
    assert posted.status_code == 308 and posted["Location"] == f"/runs/{run.pk}/pin"


def test_links_and_redirects_point_at_the_one_address_of_each_page(browser, run):
    """No page links to the old /dashboard/ prefix (each page has one address)."""
    pages = ("/queue/", "/experiments/", f"/experiments/{run.experiment_id}/runs/new",
             f"/experiments/{run.experiment_id}/", f"/runs/{run.pk}/", "/runs/", "/assets/")  # fmt: skip
    for url in pages:
        page = browser.get(url).content.decode()
        assert 'href="/dashboard/' not in page and 'action="/dashboard/' not in page, url
    assert f'href="/runs/{run.pk}/"' in browser.get("/queue/").content.decode()
    created = browser.post("/experiments/", {"name": "fresh", "preset": "moe-grpo"})
    assert created["Location"].startswith("/experiments/")


def test_experiment_page_keeps_the_platform_actions(browser, run):
    """New run, sweep builder, the run list and comments on the one experiment page."""
    url = f"/experiments/{run.experiment_id}/"
    page = browser.get(url).content.decode()
    assert f'href="/experiments/{run.experiment_id}/runs/new"' in page
    assert f'href="/experiments/{run.experiment_id}/sweeps/new"' in page
    assert f'href="/runs/{run.pk}/"' in page
    response = browser.post(url, {"body": "looks <b>stable</b>"})
    assert response.status_code == 302 and response["Location"] == url + "#comments"
    assert "looks &lt;b&gt;stable&lt;/b&gt;" in browser.get(url).content.decode()
    assert browser.post(url, {"body": "  "}).status_code == 302  # error shown as a message


def test_form_is_generated_from_the_schema():
    sections = schema_form.build_sections()
    assert [s.path for s in sections] == [
        "model", "task", "warm_start", "rollout", "algorithm", "stabilizers", "optim", "run",
        "parallel",
    ]  # fmt: skip
    fields = {f.path: f for f in schema_form.iter_fields(sections)}
    replay = fields["stabilizers.replay.mode"]
    assert replay.kind == "enum" and replay.choices == ["none", "r2", "r3"]
    assert replay.default == "none" and "replay" in replay.help
    assert fields["algorithm.advantage.ema_decay"].kind == "number"
    assert fields["model.vocab_size"].nullable
    assert fields["run.steps"].minimum == 1
    # Sub-models by owner are nested sections; the task union is a kind select plus
    # the shared fields, then one section per kind.
    stabilizers = next(s for s in sections if s.path == "stabilizers")
    assert [s.path for s in stabilizers.subsections][:3] == [
        "stabilizers.replay", "stabilizers.balance", "stabilizers.surgery",
    ]  # fmt: skip
    task = next(s for s in sections if s.path == "task")
    assert task.fields[0].path == "task.name"
    assert task.fields[0].choices == ["arithmetic", "sort", "text"]
    assert [s.path for s in task.subsections] == ["task.arithmetic", "task.sort", "task.text"]
    assert fields["task.min_len"].when == ("task.name", "sort")
    assert fields["task.data_file"].when == ("task.name", "text")
    assert fields["task.operations"].default == ["add"]
    # A mapping is typed as JSON: empty is {}, text that is not JSON goes to the schema.
    kwargs = fields["model.chat_template_kwargs"]
    assert kwargs.kind == "object" and schema_form.parse_value(kwargs, "") == {}
    assert schema_form.parse_value(kwargs, '{"enable_thinking": false}') == {
        "enable_thinking": False
    }
    assert schema_form.parse_value(kwargs, "{oops") == "{oops"


def test_new_run_form_shows_sections_defaults_and_help(browser, experiment):
    page = browser.get(f"/experiments/{experiment.pk}/runs/new?preset=moe-grpo-r3").content.decode()
    assert 'id="section-stabilizers"' in page and 'id="section-run.collapse"' in page
    assert 'name="stabilizers.replay.mode"' in page and 'id="section-stabilizers.replay"' in page
    assert 'id="section-task.sort"' in page
    assert '<option value="r3" selected>' in page
    assert "arXiv 2510.11370" in page  # the field's help text from the schema
    assert "default none" in page


def _form_post(experiment, **changes):
    sections = schema_form.build_sections()
    schema_form.fill(sections, experiment.base_config)
    data = {"mode": "form", "queue": "cpu", "priority": "0", "variant": "form run"}
    markers = []
    for f in schema_form.iter_fields(sections):
        if f.kind == "boolean":
            markers.append(f.path)
            if f.value:
                data[f.path] = "on"
        else:
            data[f.path] = f.input_value
    data[schema_form.BOOL_MARKER] = markers
    data.update(changes)
    return data


def test_new_run_form_queues_a_valid_run(browser, experiment):
    data = _form_post(experiment, **{"run.steps": "7", "stabilizers.replay.mode": "r3"})
    response = browser.post(f"/experiments/{experiment.pk}/runs/new", data)
    assert response.status_code == 302, response.content.decode()[-2000:]
    run = Run.objects.get()
    assert response["Location"] == f"/runs/{run.pk}/"
    assert run.total_steps == 7 and run.config["stabilizers"]["replay"]["mode"] == "r3"
    assert run.variant == "form run"


def test_form_sends_only_the_selected_task_kinds_fields(browser, experiment):
    changes = {"task.name": "sort", "task.max_len": "5", "model.max_seq_len": "96",
               "rollout.max_new_tokens": "32"}  # fmt: skip
    response = browser.post(
        f"/experiments/{experiment.pk}/runs/new", _form_post(experiment, **changes)
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    task = Run.objects.get().config["task"]
    assert task["name"] == "sort" and task["max_len"] == 5 and "min_digits" not in task


@pytest.mark.parametrize(
    "changes, path",
    [
        ({"run.steps": "seven"}, "run.steps"),
        ({"rollout.temperature": "-2"}, "rollout.temperature"),
        ({"model.top_k": "64"}, "model.top_k"),
        ({"algorithm.name": "sgd"}, "algorithm.name"),
    ],
)
def test_invalid_form_shows_inline_error_naming_the_field(browser, experiment, changes, path):
    response = browser.post(
        f"/experiments/{experiment.pk}/runs/new", _form_post(experiment, **changes)
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert f'<div class="error">{path}: ' in page
    assert Run.objects.count() == 0


def test_json_editor_is_validated_the_same_way(browser, experiment):
    url = f"/experiments/{experiment.pk}/runs/new"
    bad = {"mode": "json", "queue": "cpu", "config_json": json.dumps({"run": {"steps": 0, "x": 1}})}
    page = browser.post(url, bad).content.decode()
    assert "config.run.x" in page  # unknown key, listed above the form
    assert '<div class="error">run.steps: ' in page
    assert (
        browser.post(url, {"mode": "json", "queue": "cpu", "config_json": "{oops"}).status_code
        == 200
    )
    assert Run.objects.count() == 0
    good = {"mode": "json", "queue": "cpu", "config_json": json.dumps({"run": {"steps": 2}})}
    assert browser.post(url, good).status_code == 302
    assert Run.objects.get().total_steps == 2


def test_clone_prefills_the_form(browser, run):
    page = browser.get(f"/experiments/{run.experiment_id}/runs/new?clone={run.pk}").content.decode()
    assert f"Cloned from run #{run.pk}" in page
    assert 'name="run.steps" value="3"' in page


def test_sweep_builder_previews_then_creates(browser, experiment):
    url = f"/experiments/{experiment.pk}/sweeps/new"
    data = {
        "field_0": "stabilizers.replay.mode", "values_0": "none, r3",
        "field_1": "algorithm.name", "values_1": "grpo, gspo",
        "seeds": "0, 1, 2", "queue": "cpu", "action": "preview",
    }  # fmt: skip
    page = browser.post(url, data).content.decode()
    assert "<b>12 runs</b>" in page and Run.objects.count() == 0
    data["values_1"] = "grpo, adam"
    page = browser.post(url, data).content.decode()
    assert "grid.algorithm.name" in page
    data.update(values_1="grpo", action="create")
    assert browser.post(url, data).status_code == 302
    assert Run.objects.count() == 6
    assert set(Run.objects.values_list("priority", flat=True)) == {lifecycle.DEFAULT_PRIORITY}


FIVE_FIELDS = {
    "stabilizers.replay.mode": "none, r3", "algorithm.name": "grpo", "optim.lr": "0.001",
    "run.steps": "3", "rollout.group_size": "4, 8",
}  # fmt: skip


def test_the_sweep_builder_takes_any_number_of_fields_and_a_priority(browser, experiment):
    url = f"/experiments/{experiment.pk}/sweeps/new"
    opened = browser.get(url).content.decode()
    assert 'name="field_1"' in opened and 'name="field_2"' not in opened  # two rows to start
    assert 'id="add-grid-row"' in opened and 'name="priority" value="1"' in opened
    data = {"seeds": "0", "queue": "cpu", "priority": "4", "action": "preview"}
    for i, (field, values) in enumerate(FIVE_FIELDS.items()):
        data[f"field_{i + 3}"], data[f"values_{i + 3}"] = field, values  # gaps are fine
    page = browser.post(url, data).content.decode()
    assert "<b>4 runs</b>" in page, page
    assert 'name="field_5"' in page  # the five rows, renumbered, and a blank one
    assert 'name="priority" value="4"' in page
    data["action"] = "create"
    assert browser.post(url, data).status_code == 302
    runs = Run.objects.all()
    assert runs.count() == 4 and {r.priority for r in runs} == {4}
    assert {r.config["optim"]["lr"] for r in runs} == {0.001}


@pytest.mark.parametrize(
    "rows, words",
    [
        ({"field_0": "run.steps", "values_0": "3", "field_1": "run.steps", "values_1": "4"},
         "grid.run.steps: chosen in two rows"),
        ({"values_0": "3, 4"}, "grid: a row has values (3, 4) but no field"),
        ({"field_0": "run.steps", "values_0": "3", "priority": "high"},
         "priority: priority must be an integer from 0 to 9"),
        ({"field_0": "run.steps", "values_0": "3", "priority": "7"}, "priority: priority 7 needs staff"),
        ({f"field_{i}": "run.steps" for i in range(400)}, "grid: at most"),
    ],
)  # fmt: skip
def test_the_sweep_builder_names_a_bad_row_or_priority(browser, experiment, rows, words):
    url = f"/experiments/{experiment.pk}/sweeps/new"
    page = browser.post(url, {"seeds": "0", "action": "create", **rows})
    assert page.status_code == 200 and words in page.content.decode()
    assert Run.objects.count() == 0


def test_user_text_is_escaped(browser, user, run):
    comments.add_comment(author=user, body="<script>alert(1)</script>", run=run)
    run.experiment.name = "<img src=x onerror=alert(1)>"
    run.experiment.save()
    page = browser.get(f"/runs/{run.pk}/").content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img src=x" not in page


def test_forms_need_csrf(user, run):
    client = Client(enforce_csrf_checks=True)
    client.login(username="alice", password="pw-alice")
    assert client.post(f"/runs/{run.pk}/cancel").status_code == 403
    assert Run.objects.get(pk=run.pk).status == "queued"


def test_only_owner_or_staff_cancel_in_the_browser(browser, other_browser, run):
    assert other_browser.post(f"/runs/{run.pk}/cancel").status_code == 403
    assert "Cancel run" not in other_browser.get(f"/runs/{run.pk}/").content.decode()
    page = browser.get(f"/runs/{run.pk}/").content.decode()
    assert f'action="/runs/{run.pk}/cancel"' in page and f'action="/runs/{run.pk}/delete"' in page
    assert f'href="/experiments/{run.experiment_id}/runs/new?clone={run.pk}"' in page
    response = browser.post(f"/runs/{run.pk}/cancel")
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert Run.objects.get(pk=run.pk).status == "cancelled"


def test_queue_page_shows_position(browser, run):
    page = browser.get("/queue/").content.decode()
    assert f"#{run.pk}" in page and "<td>1</td>" in page
