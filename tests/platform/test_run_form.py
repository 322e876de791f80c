"""The run form for people: key fields first, folded sections with change
counts, the changes from the preset, an error summary that links to each
field, the page opened at the first error, every typed value kept."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from dashboard.web import schema_form
from lab.runs.models import Run


@pytest.fixture
def browser(user):
    client = Client()
    client.login(username="alice", password="pw-alice")
    return client


def _post_data(sections, **changes) -> dict:
    data = {"mode": "form", "queue": "cpu", "variant": "v", "start_preset": "moe-grpo"}
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


def _preset_sections():
    from lab.configs import resolve_config

    sections = schema_form.with_key_section(schema_form.build_sections())
    schema_form.fill(sections, resolve_config(preset="moe-grpo").to_dict())
    return sections


def test_key_fields_come_first_and_other_sections_are_folded(browser, experiment):
    page = browser.get(f"/experiments/{experiment.pk}/runs/new?preset=moe-grpo").content.decode()
    sections = re.findall(r'<details class="form-section" id="section-([^"]+)"( open)?>', page)
    assert sections[0] == ("key", " open")
    assert all(not is_open for _, is_open in sections[1:]) and len(sections) > 5
    key = page.split('id="section-key"')[1].split("</details>")[0]
    for path in ("model.n_experts", "algorithm.name", "stabilizers.replay.mode", "run.steps"):
        assert f'name="{path}"' in key
        assert page.count(f'name="{path}"') == 1  # moved, not repeated
    assert "none: the run trains moe-grpo as it is" in page


def test_an_error_below_the_fold_is_summarised_and_everything_typed_is_kept(browser, experiment):
    data = _post_data(
        _preset_sections(),
        **{"priority": "4", "run.steps": "12", "run.collapse.window": "-3"},
    )
    response = browser.post(f"/experiments/{experiment.pk}/runs/new", data)
    assert response.status_code == 200 and not Run.objects.exists()
    page = response.content.decode()
    summary = page.split('id="form-errors"')[1].split("</div>")[0]
    assert '<a href="#f-run.collapse.window">run.collapse.window: ' in summary
    # The page opens at the first error: its input has autofocus, its section is open.
    assert re.search(r'id="f-run.collapse.window"[^>]*autofocus', page)
    assert re.search(r'<details class="form-section" id="section-run" open>', page)
    # Priority and every other value survive the error.
    assert 'id="f-priority" name="priority" value="4"' in page
    assert re.search(r'id="f-run.steps" name="run.steps" value="12"', page)
    # The changes from the preset, and the folded section's count.
    assert "<code>run.steps</code>: 50 → <strong>12</strong>" in page
    assert re.search(r'data-changed-count="run">\s*1 changed', page)


def test_a_bad_priority_is_reported_with_the_configs_errors(browser, experiment):
    data = _post_data(_preset_sections(), **{"priority": "high", "model.top_k": "64"})
    page = browser.post(f"/experiments/{experiment.pk}/runs/new", data).content.decode()
    summary = page.split('id="form-errors"')[1].split("</div>")[0]
    assert "priority: priority must be an integer from 0 to 9" in summary
    assert "#f-model.top_k" in summary
    assert 'name="priority" value="high"' in page


def test_every_kind_of_error_is_reported_in_one_submit(browser, experiment):
    """A bad priority, an unknown registered model and a bad field: all three at once."""
    data = _post_data(
        _preset_sections(),
        **{"priority": "high", "registered_model": "no-such-model", "model.top_k": "64"},
    )
    page = browser.post(f"/experiments/{experiment.pk}/runs/new", data).content.decode()
    summary = page.split('id="form-errors"')[1].split("</div>")[0]
    assert "priority: priority must be an integer" in summary
    assert "registered_model: &#x27;no-such-model&#x27; is not registered" in summary
    assert "#f-model.top_k" in summary
    assert not Run.objects.exists()


def test_a_type_a_rule_across_fields_and_a_task_length_come_back_together(browser, experiment):
    """Three mistakes in the config, three errors after one submit: pydantic checks
    the rules across fields only once the fields are valid, so the form's check sets
    a field in error aside and checks the rest again (trainer.validation.all_errors)."""
    data = _post_data(
        _preset_sections(),
        **{
            "run.steps": "twelve",
            "run.gpus": "4",
            "rollout.prompts_per_step": "2",
            "rollout.max_new_tokens": "1",
        },
    )
    page = browser.post(f"/experiments/{experiment.pk}/runs/new", data).content.decode()
    summary = page.split('id="form-errors"')[1].split("</div>")[0]
    for path in ("run.steps", "rollout.prompts_per_step", "rollout.max_new_tokens"):
        assert f'href="#f-{path}"' in summary, path
    assert not Run.objects.exists()


def test_key_settings_are_labelled_by_their_dotted_path(browser, experiment):
    """Out of their section, "mode" or "enabled" alone would not say which."""
    page = browser.get(f"/experiments/{experiment.pk}/runs/new?preset=moe-grpo").content.decode()
    key = page.split('id="section-key"')[1].split("</details>")[0]
    labels = re.findall(r'<label for="f-([^"]+)" title="[^"]*">([^<]+)</label>', key)
    assert labels and all(path == label for path, label in labels)
    assert ("stabilizers.surgery.enabled", "stabilizers.surgery.enabled") in labels
    rest = page.split('id="section-key"')[1].split("</details>", 1)[1]
    assert '<label for="f-run.collapse.window" title="run.collapse.window">window</label>' in rest


def test_changes_are_listed_against_the_preset(browser, experiment):
    data = _post_data(_preset_sections(), **{"run.steps": "abc", "stabilizers.replay.mode": "r3"})
    page = browser.post(f"/experiments/{experiment.pk}/runs/new", data).content.decode()
    changes = page.split('id="changes"')[1].split("</section>")[0]
    assert "<code>stabilizers.replay.mode</code>: none → <strong>r3</strong>" in changes
    assert "<code>run.steps</code>" in changes and "(<span data-change-total>2</span>)" in changes


def test_a_clone_keeps_its_priority_and_counts_changes_against_the_cloned_run(
    browser, user, experiment, tiny
):
    from lab.runs import lifecycle

    run = lifecycle.submit_run(
        owner=user, experiment=experiment, preset="moe-grpo", overrides=tiny, priority=3
    )
    page = browser.get(f"/experiments/{experiment.pk}/runs/new?clone={run.pk}").content.decode()
    assert 'id="f-priority" name="priority" value="3"' in page
    assert f"Changes from run #{run.pk}" in page and f"none: the run trains run #{run.pk}" in page
