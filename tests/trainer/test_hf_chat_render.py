"""Chat templates render as transformers' ``apply_chat_template`` renders them:
the same sandboxed environment (``tojson`` without HTML escaping,
``strftime_now``, ``raise_exception``, loop controls, ``{% generation %}``), the
same variables (every named special token the tokenizer has, ``tools`` and
``documents`` as None); without a template prompts are framed as transformers'
``tokenizer(prompt)`` frames them."""

from __future__ import annotations

import json

import pytest
from hf_tiny_checkpoints import save_char_tokenizer

from trainer.errors import FieldError
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


@pytest.mark.parametrize("post_processor", [False, True])
@pytest.mark.parametrize("add_bos_token", [None, True, False])
def test_without_a_template_the_bos_rule_is_transformers(tmp_path, post_processor, add_bos_token):
    """transformers 5 frames ``tokenizer(prompt)`` by tokenizer.json's post-processor
    and ignores add_bos_token once there is one; the lab encodes prompts the same
    way in each of the six set-ups (the old rule, BOS unless add_bos_token was
    false, differed in three)."""
    save_char_tokenizer(tmp_path)
    if not post_processor:
        data = json.loads((tmp_path / "tokenizer.json").read_text())
        data["post_processor"] = None
        (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    if add_bos_token is not None:
        config["add_bos_token"] = add_bos_token
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)("12+3=")["input_ids"]
    ours = CheckpointTokenizer(tmp_path).encode("12+3=")
    assert ours == theirs
    assert (ours[0] == 1) == post_processor


SPECIALS_AND_TOOLS = """{{ bos_token }}|{{ pad_token }}|{{ unk_token }}|{{ sep_token is defined }}|
{%- if tools is none %}no tools{% endif %}|{% if documents is none %}no documents{% endif %}|
{%- for m in messages %}{{ m['content'] }}{% endfor %}"""


def test_the_template_sees_pad_unk_and_none_tools_as_transformers_passes_them(tmp_path):
    """pad and unk tokens render as their text (not empty), an unset one stays
    undefined, special_tokens_map.json is read, tools and documents are None."""
    save_char_tokenizer(tmp_path)
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"unk_token": "<eos>"}))
    (tmp_path / "chat_template.jinja").write_text(SPECIALS_AND_TOOLS)
    ours = CheckpointTokenizer(tmp_path, chat_template=True).render_prompt("hi")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    theirs = hf.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert ours == theirs == "<bos>|<pad>|<eos>|False|no tools|no documents|hi"


# Qwen3-style ChatML: the first turn may be a system prompt, assistant turns carry
# their own end marker, and enable_thinking=false opens the answer with an empty
# think block (the template variable transformers passes from apply_chat_template's
# keyword arguments).
QWEN3_STYLE = """{%- if messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + message.content | trim + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}"""

# Mistral-style [INST]: roles must alternate user/assistant after an optional system
# prompt, or the template raises (as Mixtral's does).
MISTRAL_STYLE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
{%- set system = messages[0]['content'] + '\\n\\n' %}{%- set turns = messages[1:] %}
{%- else %}{%- set system = '' %}{%- set turns = messages %}{%- endif %}
{%- for message in turns %}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
{%- endif %}
{%- if message['role'] == 'user' %}
{{- '[INST] ' + (system if loop.first else '') + message['content'] + ' [/INST]' }}
{%- else %}{{- ' ' + message['content'] + eos_token }}{%- endif %}
{%- endfor %}"""

FEW_SHOT = (
    ("system", "Answer with the number only."),
    ("user", "2+2="),
    ("assistant", "4"),
    ("user", "3+5="),
)


def _checkpoint(tmp_path, template: str):
    save_char_tokenizer(tmp_path, "0123456789+=.,:;[]/ <>|_\n" + "abcdefghijklmnopqrstuvwxyzAINST")
    plain = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(plain))
    (tmp_path / "chat_template.jinja").write_text(template)
    return transformers.AutoTokenizer.from_pretrained(tmp_path)


def _as_dicts(turns):
    return [{"role": role, "content": content} for role, content in turns]


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
def test_a_conversation_with_template_kwargs_renders_as_transformers(tmp_path, kwargs):
    hf = _checkpoint(tmp_path, QWEN3_STYLE)
    tok = CheckpointTokenizer(tmp_path, chat_template=True, template_kwargs=kwargs)
    ours = tok.render_conversation(FEW_SHOT)
    theirs = hf.apply_chat_template(
        _as_dicts(FEW_SHOT), tokenize=False, add_generation_prompt=True, **kwargs
    )
    assert ours == theirs
    assert ours.startswith("<|im_start|>system\nAnswer with the number only.<|im_end|>")
    assert ("<think>\n\n</think>" in ours) == (kwargs.get("enable_thinking") is False)
    assert tok.encode_conversation(FEW_SHOT) == hf(theirs, add_special_tokens=False)["input_ids"]


def test_a_mistral_style_template_renders_and_refuses_as_transformers(tmp_path):
    hf = _checkpoint(tmp_path, MISTRAL_STYLE)
    tok = CheckpointTokenizer(tmp_path, chat_template=True)
    theirs = hf.apply_chat_template(_as_dicts(FEW_SHOT), tokenize=False, add_generation_prompt=True)
    assert tok.render_conversation(FEW_SHOT) == theirs
    assert theirs.startswith("<bos>[INST] Answer with the number only.\n\n2+2= [/INST] 4<eos>")
    broken = (("user", "1+1="), ("user", "2+2="))
    with pytest.raises(Exception, match="must alternate"):
        hf.apply_chat_template(_as_dicts(broken), tokenize=False, add_generation_prompt=True)
    with pytest.raises(FieldError, match="must alternate") as exc:
        tok.render_conversation(broken)
    assert "model.chat_template" in exc.value.as_dict()


def test_a_messages_dataset_row_becomes_its_rendered_conversation(tmp_path):
    """task.messages_field: each row's turns are the prompt, rendered by the template
    with the run's template kwargs; rows whose turns are unusable are skipped by reason."""
    from trainer.config import TextTaskConfig
    from trainer.run.batches import collate_prompts
    from trainer.tasks.text_data import build_problems
    from trainer.tasks.verifiers import make_verifier

    hf = _checkpoint(tmp_path, QWEN3_STYLE)
    tok = CheckpointTokenizer(
        tmp_path, chat_template=True, template_kwargs={"enable_thinking": False}
    )
    rows = [
        {"messages": _as_dicts(FEW_SHOT), "answer": "8"},
        {"messages": _as_dicts(FEW_SHOT[:2]), "answer": "4"},
        {"messages": _as_dicts(FEW_SHOT[:3]), "answer": "4"},  # ends with the assistant
        {"messages": [{"role": "tool", "content": "x"}], "answer": "1"},
        {"messages": "2+2=", "answer": "4"},
        {"question": "2+2=", "answer": "4"},
    ]
    cfg = TextTaskConfig(data_file="x.jsonl", messages_field="messages", verifier="exact")
    table = build_problems(rows, cfg, make_verifier("exact", 0.0, "ABCD", None))
    assert [p.prompt for p in table.problems] == ["3+5=", "2+2="]
    assert table.problems[0].messages == FEW_SHOT
    reasons = " | ".join(table.bad_rows)
    for said in ("last turn is not a non-empty user turn", "role 'tool'", "not a non-empty list",
                 "messages field 'messages' is missing"):  # fmt: skip
        assert said in reasons, said
    prompts, mask = collate_prompts(table.problems[:1], tok)
    expected = hf.apply_chat_template(
        _as_dicts(FEW_SHOT), tokenize=True, add_generation_prompt=True, enable_thinking=False
    )
    expected = expected if isinstance(expected, list) else expected["input_ids"]
    assert prompts[0][mask[0]].tolist() == expected


def test_messages_and_template_kwargs_are_checked_by_the_schema():
    from trainer.validation import validate_config

    def errors(data):
        with pytest.raises(FieldError) as exc:
            validate_config(data)
        return exc.value.as_dict()

    text = {"name": "text", "messages_field": "messages"}
    assert "task.messages_field" in errors({"task": text})
    both = {**text, "prompt_template": "Q: {question}"}
    assert "task.prompt_template" in errors({"task": both})
    assert "model.chat_template_kwargs" in errors(
        {"model": {"chat_template_kwargs": {"enable_thinking": False}}}
    )
    taken = errors({"model": {"source": "/x", "chat_template": True,
                              "chat_template_kwargs": {"messages": "x"}}})  # fmt: skip
    assert "model.chat_template_kwargs" in taken
