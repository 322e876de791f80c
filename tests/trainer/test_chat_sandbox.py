"""Chat templates render in a sandbox with bounds (trainer/hf/chat_sandbox.py): a
template that loops for minutes, recurses, writes gigabytes or reaches past the
jinja sandbox is a field error naming the bound, at registration (the probe in
``validate_checkpoint``) and in a run, never a hang or a traceback."""

from __future__ import annotations

import time

import pytest
from hf_tiny_checkpoints import save_char_tokenizer, save_hf_checkpoint

from trainer.cli import main as cli_main
from trainer.errors import BAD_INPUT_EXIT_CODE, FieldError
from trainer.hf.chat_sandbox import ChatTemplateSandbox, RenderLimits, TemplateRefused
from trainer.hf.tokenizer import CheckpointTokenizer
from trainer.hf.validate import validate_checkpoint

FAST = RenderLimits(time_s=1.0, max_chars=10_000, memory_mb=512, start_s=8.0)

# The kinds of hostile template a review registered, and the bound each breaks.
HOSTILE = {
    "nested loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "timeout",
    ),
    "recursive macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion"),
    "huge output": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "too_long"),
    "huge string": ("{{ 'x' * 10 ** 10 }}", "memory"),
    "huge number": ("{{ 10 ** (10 ** 9) }}", None),  # memory or time: either bound stops it
    "sandbox escape": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    "lorem ipsum": ("{{ lipsum(n=10 ** 7) }}", None),
    "syntax": ("{% for %}", "syntax"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_template_breaks_a_bound_not_the_process(name):
    source, kind = HOSTILE[name]
    t0 = time.monotonic()
    with pytest.raises(TemplateRefused) as info:
        sandbox = ChatTemplateSandbox(source, FAST)
        try:
            sandbox.render({"messages": [{"role": "user", "content": "hi"}]})
        finally:
            sandbox.close()
    assert time.monotonic() - t0 < 25
    if kind is not None:
        assert info.value.kind == kind, str(info.value)
    assert "Traceback" not in str(info.value) and len(str(info.value)) < 3000


def test_a_good_template_renders_and_the_process_survives_a_refusal():
    sandbox = ChatTemplateSandbox(
        "{% if messages[0].content == 'no' %}{{ raise_exception('not this one') }}{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
        FAST,
    )
    try:
        with pytest.raises(TemplateRefused, match="not this one") as info:
            sandbox.render({"messages": [{"role": "user", "content": "no"}]})
        assert info.value.kind == "refused"
        text = sandbox.render({"messages": [{"role": "user", "content": "2+2"}]})
        assert text == "<user>2+2"
    finally:
        sandbox.close()


def test_a_render_over_the_bound_restarts_the_process():
    sandbox = ChatTemplateSandbox(
        "{% if messages[0].content == 'spin' %}{% for i in range(100000) %}"
        "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}ok",
        FAST,
    )
    try:
        with pytest.raises(TemplateRefused) as info:
            sandbox.render({"messages": [{"role": "user", "content": "spin"}]})
        assert info.value.kind == "timeout"
        assert sandbox.render({"messages": [{"role": "user", "content": "x"}]}) == "ok"
    finally:
        sandbox.close()


def test_a_template_over_the_source_bound_is_refused_unread():
    with pytest.raises(TemplateRefused, match="characters"):
        ChatTemplateSandbox("x" * 101, RenderLimits(max_source_chars=100))


def _checkpoint(folder, template: str):
    save_hf_checkpoint("llama", folder)
    save_char_tokenizer(folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder


@pytest.mark.slow  # a transformers checkpoint
@pytest.mark.parametrize("name", ["recursive macro", "sandbox escape", "syntax", "huge output"])
def test_registration_refuses_a_hostile_template_naming_the_field(tmp_path, name):
    folder = _checkpoint(tmp_path / "ckpt", HOSTILE[name][0])
    errors = validate_checkpoint(folder, field="path")
    assert errors and errors[0][0] == "path", errors
    assert "chat template" in errors[0][1] and "Traceback" not in errors[0][1]


@pytest.mark.slow  # a transformers checkpoint
def test_registration_accepts_a_template_that_refuses_the_probe_on_purpose(tmp_path):
    folder = _checkpoint(
        tmp_path / "ckpt",
        "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    assert validate_checkpoint(folder, field="path") == []


@pytest.mark.slow  # a transformers checkpoint
def test_a_run_stops_with_a_field_error_when_a_prompt_hangs_the_template(tmp_path, capsys):
    """A template that passes the probe but spins on the run's prompts: the run's
    length check renders them in the sandbox and exits 2 naming the field."""
    spin = (  # the run's arithmetic prompts ("15+75=") alone, never a probe conversation
        "{% if messages|length == 1 and '=' in messages[0].content %}{% for i in range(100000) %}"
        "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    src = _checkpoint(tmp_path / "ckpt", spin)
    assert validate_checkpoint(src) == []
    run_dir = tmp_path / "run"
    args = ["run", "--preset", "moe-grpo", "--set", f"model.source={src}"]
    args += ["--set", "model.chat_template=true", "--out", str(run_dir)]
    t0 = time.monotonic()
    assert cli_main(args) == BAD_INPUT_EXIT_CODE
    err = capsys.readouterr().err
    assert "model.chat_template" in err and "longer than" in err and "Traceback" not in err
    assert time.monotonic() - t0 < 120 and not run_dir.exists()


@pytest.mark.slow  # a transformers checkpoint
def test_the_tokenizer_names_the_field_for_a_recursive_template(tmp_path):
    src = _checkpoint(tmp_path / "ckpt", "{% for m in messages %}{{ m.content }}{% endfor %}")
    (src / "chat_template.jinja").write_text(HOSTILE["recursive macro"][0])
    tok = CheckpointTokenizer(src, chat_template=True)
    with pytest.raises(FieldError) as info:
        tok.render_prompt("x")
    assert info.value.errors[0][0] == "model.chat_template"
    assert "recursed too deeply" in info.value.errors[0][1]
