"""Each bad input that once answered 500 (DEBUG off, PostgreSQL) now answers 400
naming the field (API) or an inline error (browser), and stores nothing.

Run on PostgreSQL too (``DATABASE_URL=...``): NUL is the input SQLite accepts
and PostgreSQL refuses."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from lab_processes import submit_tiny_run

from lab.experiments.models import Experiment
from lab.inputs.json_input import JSONTooDeep, json_depth, loads, value_depth
from lab.runs.models import Comment, Run


@pytest.fixture
def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _post(client, url, payload):
    return client.post(url, json.dumps(payload), content_type="application/json")


def _raw_json(payload: dict, raw: str) -> str:
    """``payload`` as JSON with the string "@" replaced by ``raw`` (text json.dumps
    never writes: 1e400, Infinity, deep nesting)."""
    return json.dumps(payload).replace('"@"', raw)


def _errors(response) -> dict:
    assert response.status_code == 400, response.content
    return response.json()["errors"]


# --------------------------------------------------------------------------- NUL and controls
@pytest.mark.parametrize("field", ["name", "description"])
def test_nul_in_experiment_text_is_a_field_error(api, field):
    payload = {"name": "ok", field: "bad\x00text"}
    assert field in _errors(_post(api, "/api/experiments", payload))
    assert not Experiment.objects.exists()


def test_control_characters_in_a_name_or_tag_are_refused_but_newlines_in_text_kept(api):
    assert "name" in _errors(_post(api, "/api/experiments", {"name": "a\x1bb"}))
    assert "tags" in _errors(_post(api, "/api/experiments", {"name": "a", "tags": ["x\ty"]}))
    made = _post(api, "/api/experiments", {"name": "a", "description": "line 1\nline 2\tend"})
    assert made.status_code == 201 and made.json()["description"] == "line 1\nline 2\tend"


def test_nul_anywhere_in_a_json_body_names_its_path(api, experiment):
    errors = _errors(
        _post(api, "/api/runs", {"experiment": experiment.pk, "config": {"run": {"x\x00": 1}}})
    )
    assert "config.run" in errors
    errors = _errors(_post(api, "/api/runs", {"experiment": experiment.pk, "variant": "\ud800"}))
    assert "variant" in errors
    assert not Run.objects.exists()


def test_nul_in_browser_forms_is_an_inline_error(browser, user, experiment):
    page = browser.post("/experiments/", {"name": "bad\x00name"})
    assert page.status_code == 200 and "U+0000" in page.content.decode()
    run = submit_tiny_run(user, experiment)
    url = f"/runs/{run.pk}/"
    assert browser.post(url, {"body": "a\x00b"}).status_code == 302  # shown as a message
    assert "U+0000" in browser.get(url).content.decode()
    assert not Comment.objects.exists()
    page = browser.post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "queue": "cpu", "variant": "v\x00", "config_json": "{}"},
    )
    assert page.status_code == 200 and "variant cannot contain U+0000" in page.content.decode()
    assert Run.objects.count() == 1


@pytest.mark.parametrize("param", ["owner", "queue", "tag", "status"])
def test_nul_in_a_filter_is_a_400_naming_it(browser, api, param):
    page = browser.get("/runs/", {param: "a\x00"})
    assert page.status_code == 400 and param in page.content.decode()
    assert param in _errors(api.get("/api/runs", {param: "a\x00"}))


# --------------------------------------------------------------------------- non-finite numbers
def test_1e400_in_a_json_body_names_the_field(api, experiment):
    body = _raw_json(
        {"experiment": experiment.pk, "config": {"optim": {"grad_clip": "@"}}}, "1e400"
    )
    response = api.post("/api/runs", body, content_type="application/json")
    assert "config.optim.grad_clip" in _errors(response)


@pytest.mark.parametrize("literal", ["Infinity", "NaN", "-Infinity"])
def test_non_json_constants_are_a_parse_error(api, experiment, literal):
    body = _raw_json(
        {"experiment": experiment.pk, "config": {"optim": {"grad_clip": "@"}}}, literal
    )
    response = api.post("/api/runs", body, content_type="application/json")
    assert response.status_code == 400 and literal in response.json()["detail"]


@pytest.mark.parametrize("raw", ["Infinity", "1e400", "NaN"])
def test_infinite_override_names_the_field(api, experiment, raw):
    payload = {"experiment": experiment.pk, "preset": "moe-grpo",
               "overrides": [f"stabilizers.is_correction.tis_cap={raw}"]}  # fmt: skip
    assert "config.stabilizers.is_correction.tis_cap" in _errors(_post(api, "/api/runs", payload))


def test_inf_in_a_form_field_is_an_inline_error(browser, experiment):
    page = browser.get(f"/experiments/{experiment.pk}/runs/new").content.decode()
    assert 'name="optim.grad_clip"' in page
    response = browser.post(
        f"/experiments/{experiment.pk}/runs/new", {"queue": "cpu", "optim.grad_clip": "inf"}
    )
    assert response.status_code == 200 and "finite" in response.content.decode()
    assert not Run.objects.exists()


def test_sweep_grid_with_infinity_is_a_field_error(browser, experiment):
    page = browser.post(
        f"/experiments/{experiment.pk}/sweeps/new",
        {"field_0": "optim.grad_clip", "values_0": "1e400, 1.0", "seeds": "0",
         "queue": "cpu", "action": "create"},
    )  # fmt: skip
    assert page.status_code == 200 and "grid.optim.grad_clip" in page.content.decode()
    assert not Run.objects.exists()


# --------------------------------------------------------------------------- nesting
def test_json_nested_a_thousand_levels_is_a_400(api, experiment):
    body = _raw_json({"experiment": experiment.pk, "config": "@"}, "[" * 1000 + "]" * 1000)
    assert len(body) < 2100
    response = api.post("/api/runs", body, content_type="application/json")
    assert response.status_code == 400 and "nested" in response.json()["detail"]
    response = api.post("/api/runs", "[" * 100_000, content_type="application/json")
    assert response.status_code == 400


def test_the_json_editor_and_sweep_values_refuse_deep_nesting_inline(browser, experiment):
    deep = "[" * 5000 + "]" * 5000
    page = browser.post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "queue": "cpu", "config_json": deep},
    )
    assert page.status_code == 200 and "nested 5000 levels deep" in page.content.decode()
    sweep = browser.post(
        f"/experiments/{experiment.pk}/sweeps/new",
        {"field_0": "algorithm.name", "values_0": deep, "seeds": "0", "action": "preview"},
    )
    assert sweep.status_code == 200
    form = browser.post(
        f"/experiments/{experiment.pk}/runs/new",
        {"queue": "cpu", "task.name": "arithmetic", "task.operations": deep},
    )
    assert form.status_code == 200


def test_depth_ignores_brackets_inside_strings():
    assert json_depth('{"a": "[[[[{{{{", "b": [1, {"c": []}]}') == 4
    assert json_depth('"\\"[[["') == 0
    assert json_depth("[" * 40) == 40


@pytest.mark.parametrize(
    "text", ['{"a": "[[[[{{{{", "b": [1, {"c": []}]}', "[]", "{}", "7", '[[1], {"a": [[]]}]']
)
def test_a_parsed_values_depth_is_its_texts(text):
    assert value_depth(json.loads(text)) == json_depth(text)


@pytest.mark.parametrize("text", ["[" * 40, "[" * 40 + "]" * 40, "[" * 5000 + "]" * 5000])
def test_too_deep_is_named_valid_or_not(text):
    with pytest.raises(JSONTooDeep, match=r"nested \d+ levels deep"):
        loads(text)


# --------------------------------------------------------------------------- ids and numbers
@pytest.mark.parametrize("value", ["²", "١٢", "9" * 30, "-1", "1e3"])
def test_non_ascii_or_huge_ids_never_500(api, browser, user, experiment, value):
    run = submit_tiny_run(user, experiment)
    assert api.get("/api/runs", {"experiment": value}).status_code == 200  # filter ignored
    assert (
        browser.get(f"/experiments/{experiment.pk}/runs/new", {"clone": value}).status_code == 200
    )
    saved = browser.post("/comparisons/save", {"name": "x", "runs": f"{run.pk},{value}",
                                                          "baseline": value})  # fmt: skip
    assert saved.status_code == 302
    form = browser.post(
        f"/experiments/{experiment.pk}/runs/new",
        {"mode": "json", "queue": "cpu", "priority": value, "config_json": "{}"},
    )
    assert form.status_code == 200 and "priority" in form.content.decode()
    for url in ("/compare/", "/stability/"):
        assert browser.get(url, {"runs": value}).status_code in (200, 400)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e300", "1e20"])
def test_inf_in_dashboard_integer_parameters_is_a_400(browser, user, experiment, value):
    run = submit_tiny_run(user, experiment)
    chart = browser.get(f"/runs/{run.pk}/chart", {"key": "reward/mean", "max_points": value})
    assert chart.status_code == 400 and "max_points" in chart.json()["errors"]
    for params in ({"layer": value, "runs": str(run.pk)}, {"baseline": value, "runs": str(run.pk)}):
        assert browser.get("/compare/", params).status_code == 400
    assert browser.get("/stability/", {"experiment": value}).status_code == 400


def test_limit_1e20_on_the_run_list_is_a_400(api):
    assert "limit" in _errors(api.get("/api/runs", {"limit": "1e20"}))
    assert "limit" in _errors(api.get("/api/runs", {"limit": "100000000000000000000"}))


# --------------------------------------------------------------------------- logging
def test_unexpected_api_errors_are_logged_with_their_traceback(settings):
    import logging

    from lab.api.errors import json_exception_handler

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("lab.api")
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError("boom")
        except RuntimeError as exc:
            assert json_exception_handler(exc, {"view": None}) is None  # Django answers 500
    finally:
        logger.removeHandler(handler)
    assert records and records[0].exc_info[0] is RuntimeError
    assert settings.LOGGING["loggers"]["lab.api"]["handlers"] == ["console"]  # stderr


@pytest.mark.parametrize("model", ["text", 3, ["a"]])
def test_a_section_that_is_not_an_object_is_a_field_error(api, experiment, model):
    """Every check of the config gate runs on one answer (lab.configs): the ones that
    read a section must not trip over a section of the wrong type."""
    response = api.post(
        "/api/runs", {"experiment": experiment.pk, "config": {"model": model}}, format="json"
    )
    assert response.status_code == 400
    assert "config.model" in response.json()["errors"]
