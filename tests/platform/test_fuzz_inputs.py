"""Property: no input, however malformed, makes the API or a form answer 5xx.

Hypothesis draws query strings and JSON bodies for every API endpoint that
takes input (experiments, runs, sweeps, comments, cancel, clone, metrics,
queue) and form posts and query strings for the pages (new experiment, new
run, new sweep, comments, verdicts, pins, sharing, compare, stability, the
runs list). Values mix arbitrary text with the inputs that once answered 500:
NUL and control characters, non-finite and huge numbers, Unicode digits, deep
nesting. The Django test client re-raises a view's exception, so an unhandled
error fails the example as surely as a 500 status does.

Sized for the default test run (about 30 s): ``EXAMPLES`` per endpoint group.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lab_processes import submit_tiny_run

from trainer.config import ExperimentConfig

# LAB_FUZZ_EXAMPLES=2000 hunts longer, with fresh random examples each time.
pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("LAB_FUZZ_EXAMPLES", 400))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    # the default run draws the same examples every time, so a failure reproduces
    derandomize="LAB_FUZZ_EXAMPLES" not in os.environ,
    database=None,
)

NASTY = [
    "", " ", "\x00", "a\x00b", "\x1b[31m", "\t", "\n", "²", "١٢٣", "٣", "0", "-1", "1",
    "9" * 25, "1e20", "1e400", "-1e400", "inf", "-inf", "Infinity", "NaN", "nan", "1.5",
    "true", "null", "[]", "{}", "[" * 1200, "%00", "../../etc/passwd", "<script>", "'; --",
    "cpu", "gpu-a100", "queued", "running", "moe-grpo", "reward/mean", "model.n_layers",
    "stable", "collapsed", "\u202e", "\ufeff", "𝟘",
]  # fmt: skip

# Three in four values come from the known-nasty list, the rest is arbitrary text.
_nasty = st.sampled_from(NASTY)
text = st.one_of(_nasty, _nasty, _nasty, st.text(max_size=40))
# JSON bodies also carry what a query string cannot: lone surrogates, raw numbers
json_text = st.one_of(text, st.sampled_from(["\ud800", "x\udfff"]))
numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, 9, 10, -1, 2**63, 10**400]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, json_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(json_text, text), inner, max_size=4)
    ),
    max_leaves=12,
)


# Real config paths, so that values reach the schema's checks (finite floats, ranges)
CONFIG_PATHS = [
    f"{section}.{name}"
    for section, field in ExperimentConfig.model_fields.items()
    for name in getattr(field.annotation, "model_fields", {})
]
config_values = st.one_of(numbers, st.sampled_from([10**400, -(10**400), 1e308]), json_text)
overrides = st.one_of(
    st.dictionaries(st.sampled_from(CONFIG_PATHS), config_values, max_size=3),
    st.lists(st.builds("{}={}".format, st.sampled_from(CONFIG_PATHS), text), max_size=3),
)
configs = st.dictionaries(st.sampled_from(CONFIG_PATHS), config_values, max_size=3).map(
    lambda flat: {
        path.split(".")[0]: {
            p.split(".")[1]: v for p, v in flat.items() if p.startswith(path.split(".")[0] + ".")
        }
        for path in flat
    }
)
FIELD_VALUES = {
    "config": configs,
    "base_config": configs,
    "overrides": overrides,
    "grid": st.dictionaries(
        st.sampled_from(CONFIG_PATHS), st.lists(config_values, max_size=3), max_size=2
    ),
}


def body_for(fields: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object over the endpoint's own field names (and a stray one); config
    fields hold real config paths half of the time."""
    keys = st.sampled_from([*fields, "unknown"])  # never empty
    return st.dictionaries(keys, json_values, max_size=len(fields) + 1).flatmap(
        lambda body: st.fixed_dictionaries(
            {
                key: st.one_of(st.just(value), FIELD_VALUES[key])
                if key in FIELD_VALUES
                else st.just(value)
                for key, value in body.items()
            }
        )
    )


def query_for(params: list[str]) -> st.SearchStrategy[dict[str, str]]:
    """Values for the endpoint's parameters (and a stray one, which it ignores)."""
    return st.dictionaries(st.sampled_from([*params, "other"]), text, max_size=len(params) + 1)


def _ok(response, what: str) -> None:
    assert response.status_code < 500, (what, response.status_code, response.content[:500])


def _raw_body(payload: dict[str, Any]) -> str:
    """JSON the way a hostile client writes it: big ints as digits, and 10**400 as
    1e400 (json.dumps would write the 401 digits, which the parser refuses)."""
    return json.dumps(payload).replace(str(10**400), "1e400")


@pytest.fixture
def world(user, other_user, experiment):
    """alice's experiment with one queued run; bob is an outsider; the reconciler is up
    (its live-worker row), so /api/health answers 200 and any 5xx is a finding."""
    from lab.jobs.services import register_worker

    register_worker("control@fuzz", queues=["control"], pid=1, beat_pid=2, beat_alive=True)
    run = submit_tiny_run(user, experiment)
    alice, bob = Client(), Client()
    alice.force_login(user)
    bob.force_login(other_user)
    return {"alice": alice, "bob": bob, "run": run, "experiment": experiment}


# --------------------------------------------------------------------------- API
API_POSTS = {
    "/api/experiments": ["name", "description", "tags", "base_config", "preset", "overrides"],
    "/api/runs": ["experiment", "config", "preset", "overrides", "queue", "priority", "variant"],
    "/api/sweeps": ["experiment", "name", "base_config", "preset", "grid", "seeds", "queue",
                    "preview"],
    "/api/runs/{run}/comments": ["body"],
    "/api/runs/{run}/clone": ["overrides", "queue"],
    "/api/runs/{run}/cancel": [],
    "/api/experiments/{experiment}": ["shared_with"],  # PATCH
}  # fmt: skip
API_GETS = {
    "/api/runs": ["experiment", "status", "limit", "offset"],
    "/api/queue": ["limit", "offset"],
    "/api/experiments": ["limit", "offset"],
    "/api/runs/{run}/metrics": ["keys", "max_points", "start", "end"],
    "/api/runs/{run}/comments": ["limit"],
    "/api/runs/{id}": [],
    "/api/health": [],
}


def _url(template: str, world, any_id: str) -> str:
    return template.format(run=world["run"].pk, experiment=world["experiment"].pk, id=any_id)


@FUZZ
@given(data=st.data())
def test_api_posts_never_5xx(world, data):
    template = data.draw(st.sampled_from(sorted(API_POSTS)))
    payload = data.draw(body_for(API_POSTS[template]))
    if "experiment" in payload and data.draw(st.booleans()):
        payload["experiment"] = world["experiment"].pk  # reach the config checks too
    client = world[data.draw(st.sampled_from(["alice", "bob"]))]
    url = _url(template, world, "1")
    method = client.patch if template == "/api/experiments/{experiment}" else client.post
    _ok(method(url, _raw_body(payload), content_type="application/json"), url)


@FUZZ
@given(data=st.data())
def test_api_gets_never_5xx(world, data):
    template = data.draw(st.sampled_from(sorted(API_GETS)))
    any_id = data.draw(st.sampled_from(["1", "0", "9" * 19, "2147483648"]))
    url = _url(template, world, any_id)
    _ok(world["alice"].get(url, data.draw(query_for(API_GETS[template]))), url)


@FUZZ
@given(body=st.one_of(st.binary(max_size=300), st.text(max_size=300)), deep=st.integers(0, 3000))
def test_api_raw_bodies_never_5xx(world, body, deep):
    raw = body if deep < 2000 else "[" * deep + '"x"' + "]" * deep
    _ok(world["alice"].post("/api/runs", raw, content_type="application/json"), "/api/runs")


# --------------------------------------------------------------------------- forms and pages
FORMS = {
    "/experiments/": ["name", "description", "tags", "preset"],
    "/experiments/{experiment}/runs/new": ["mode", "queue", "priority", "variant", "config_json",
                                           "model.n_layers", "optim.grad_clip", "task.operations",
                                           "stabilizers.replay.mode", "run.steps"],
    "/experiments/{experiment}/sweeps/new": ["name", "preset", "field_0", "values_0", "field_1",
                                             "values_1", "field_7", "seeds", "queue", "priority",
                                             "action"],
    "/experiments/{experiment}/sharing": ["groups"],
    "/runs/{run}/": ["body"],
    "/experiments/{experiment}/": ["body"],
    "/runs/{run}/verdict": ["label", "note"],
    "/runs/{run}/pin": [],
    "/experiments/{experiment}/unpin": ["next"],
    "/comparisons/save": ["name", "runs", "baseline"],
}  # fmt: skip
PAGES = {
    "/runs/": ["experiment", "status", "tag", "owner", "queue", "sort", "page"],
    "/compare/": ["runs", "baseline", "layer"],
    "/stability/": ["runs", "experiment", "sweep", "format"],
    "/runs/{run}/": ["baseline"],
    "/runs/{run}/chart": ["key", "max_points", "start", "end", "baseline", "format"],
    "/experiments/{experiment}/runs/new": ["preset", "clone"],
    "/experiments/{experiment}/sweeps/new": ["field_0", "values_0", "seeds"],
    "/queue/": ["page"],
}


@FUZZ
@given(data=st.data())
def test_form_posts_never_5xx(world, data):
    template = data.draw(st.sampled_from(sorted(FORMS)))
    form = data.draw(query_for(FORMS[template]))
    if template.endswith("runs/new") and data.draw(st.booleans()):
        form["mode"] = "json"
        form["config_json"] = _raw_body(data.draw(body_for(["run", "model", "optim", "x"])))
    if template.endswith("sweeps/new"):
        form.setdefault("action", data.draw(st.sampled_from(["preview", "create"])))
    client = world[data.draw(st.sampled_from(["alice", "bob"]))]
    url = _url(template, world, "1")
    _ok(client.post(url, form), url)


@FUZZ
@given(data=st.data())
def test_page_queries_never_5xx(world, data):
    template = data.draw(st.sampled_from(sorted(PAGES)))
    url = _url(template, world, "1")
    _ok(world["alice"].get(url, data.draw(query_for(PAGES[template]))), url)
