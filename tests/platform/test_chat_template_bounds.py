"""A checkpoint's chat template is rendered in a sandbox with bounds at registration
too: each hostile template is a 400 naming ``path`` (or ``config.model.source``
for a run that names the folder), answered within the request, nothing stored."""

from __future__ import annotations

import shutil
import time

import pytest
from hf_tiny_checkpoints import save_char_tokenizer, save_hf_checkpoint

from lab.assets.models import RegisteredModel
from lab.runs.models import Run

pytestmark = pytest.mark.slow  # a transformers checkpoint, one child process per template

HOSTILE = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "recursive macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "huge output": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "huge string": "{{ 'x' * 10 ** 10 }}",
    "sandbox escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "lorem ipsum": "{{ lipsum(n=10 ** 7) }}",
    "syntax": "{% for %}",
    "deep nesting": "{% if true %}" * 3000 + "x" + "{% endif %}" * 3000,
}


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    save_hf_checkpoint("llama", folder)
    save_char_tokenizer(folder)
    return folder


def _with_template(base, folder, template: str):
    shutil.copytree(base, folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_registration_refuses_each_hostile_template(api, base_checkpoint, tmp_path, name):
    folder = _with_template(base_checkpoint, tmp_path / "ckpt", HOSTILE[name])
    t0 = time.monotonic()
    response = api.post("/api/models", {"name": "m", "path": str(folder)}, format="json")
    assert time.monotonic() - t0 < 60
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert list(errors) == ["path"] and "chat template" in errors["path"][0]
    assert "Traceback" not in errors["path"][0] and len(errors["path"][0]) < 3000
    assert not RegisteredModel.objects.exists()


def test_a_run_naming_such_a_folder_is_refused_at_model_source(
    api, experiment, base_checkpoint, tmp_path
):
    folder = _with_template(base_checkpoint, tmp_path / "ckpt", HOSTILE["recursive macro"])
    response = api.post(
        "/api/runs",
        {
            "experiment": experiment.pk,
            "preset": "moe-grpo",
            "overrides": {"model.source": str(folder)},
        },
        format="json",
    )
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert (
        "config.model.source" in errors
        and "recursed too deeply" in errors["config.model.source"][0]
    )
    assert not Run.objects.exists()


def test_a_real_template_registers(api, base_checkpoint, tmp_path):
    folder = _with_template(
        base_checkpoint,
        tmp_path / "ckpt",
        "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}",
    )
    response = api.post("/api/models", {"name": "m", "path": str(folder)}, format="json")
    assert response.status_code == 201, response.content
