"""Chat templates render as transformers' ``apply_chat_template`` renders them:
the same sandboxed environment (``tojson`` without HTML escaping,
``strftime_now``, ``raise_exception``, loop controls), and
tokenizer_config.json's ``add_bos_token: false`` honoured."""

from __future__ import annotations

import json

import pytest
from hf_tiny_checkpoints import save_char_tokenizer

from trainer.hf.tokenizer import CheckpointTokenizer

transformers = pytest.importorskip("transformers")

# Llama-3.1-style: dates its system prompt with strftime_now, serialises a tool with tojson.
LLAMA31_STYLE = """{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = strftime_now("%d %b %Y") %}{%- endif %}
<|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: {{ date_string }}
{{ {"name": "calc", "description": "a <b> & 'c'"} | tojson(indent=4) }}<|eot_id|>
{%- for message in messages %}
{%- if loop.index > 8 %}{% break %}{% endif %}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] | trim }}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""


def test_a_llama31_style_template_renders_as_transformers(tmp_path):
    save_char_tokenizer(tmp_path)
    plain = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(plain))
    (tmp_path / "chat_template.jinja").write_text(LLAMA31_STYLE)
    ours = CheckpointTokenizer(tmp_path, chat_template=True).render_prompt("What is 2 + 3?")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    theirs = hf.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    assert ours == theirs
    assert "\"a <b> & 'c'\"" in ours and "\\u003c" not in ours


def test_raise_exception_is_a_template_error(tmp_path):
    save_char_tokenizer(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('no system role') }}")
    with pytest.raises(Exception, match="no system role"):
        CheckpointTokenizer(tmp_path, chat_template=True).render_prompt("x")


def test_add_bos_token_false_adds_no_bos(tmp_path):
    save_char_tokenizer(tmp_path)
    assert CheckpointTokenizer(tmp_path).encode("12")[0] == 1  # <bos>
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": False}))
    tok = CheckpointTokenizer(tmp_path)
    assert tok.encode("12") == tok.encode("12", bos=False)
