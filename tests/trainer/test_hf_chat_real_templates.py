"""Every chat template TRL ships, rendered by the lab as transformers'
``apply_chat_template`` renders it.

The template texts are not copied into this repository: TRL (a test dependency)
ships released templates (Qwen2.5/3, Llama 3.x, DeepSeek-V3, GLM-4.5, GPT-OSS,
Gemma, Phi-3, LFM2, Nemotron, Cohere, ...) and their ``_training`` variants, whose
``{% generation %}`` blocks mark the assistant's text for an assistant-only loss,
as data in trl/chat_templates. For each: the rendered text of two conversations
(with the generation prompt) equals transformers' (or both refuse it: a vision
template over plain-string content), and for each template with the tag the token
ids and assistant mask of an answered conversation equal
``apply_chat_template(tokenize=True, return_dict=True, return_assistant_tokens_mask=True)``.
"""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
from hf_tiny_checkpoints import save_char_tokenizer

from trainer.errors import FieldError
from trainer.hf.tokenizer import CheckpointTokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")

TEMPLATES = sorted(
    p.name
    for p in (resources.files("trl") / "chat_templates").iterdir()
    if p.name.endswith(".jinja")
)
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
CONVERSATIONS = {
    "one question": (("user", "What is 2 + 3?"),),
    "system and few-shot": (
        ("system", "Answer with the number only."),
        ("user", "2+2="),
        ("assistant", "4"),
        ("user", "3+5="),
    ),
}
ANSWERED = (("user", "2+2="), ("assistant", "4"), ("user", "3+5="), ("assistant", "8"))


def _real_template(name: str) -> str:
    return (resources.files("trl") / "chat_templates" / name).read_text()


def _checkpoint(tmp_path, template: str):
    """A character tokenizer with the real template (the template's own markers are
    split into characters alike by both)."""
    save_char_tokenizer(tmp_path)
    plain = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<pad>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(plain))
    (tmp_path / "chat_template.jinja").write_text(template)
    return transformers.AutoTokenizer.from_pretrained(tmp_path)


def _messages(turns):
    return [{"role": r, "content": c} for r, c in turns]


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_trl_template_renders_as_transformers(tmp_path, name):
    hf = _checkpoint(tmp_path, _real_template(name))
    tok = CheckpointTokenizer(tmp_path, chat_template=True)
    for turns in CONVERSATIONS.values():
        try:
            theirs = hf.apply_chat_template(
                _messages(turns), tokenize=False, add_generation_prompt=True
            )
        except Exception:
            with pytest.raises(FieldError, match=r"model\.chat_template"):
                tok.render_conversation(turns)
            continue
        assert tok.render_conversation(turns) == theirs, name


GENERATION_TEMPLATES = [n for n in TEMPLATES if GENERATION_TAG.search(_real_template(n))]


@pytest.mark.parametrize("name", GENERATION_TEMPLATES)
def test_the_assistant_mask_is_transformers_and_trls(tmp_path, name):
    """TRL's assistant-only loss reads ``assistant_masks``: the lab's mask of an
    answered conversation is the same, token for token, and marks the answers."""
    hf = _checkpoint(tmp_path, _real_template(name))
    tok = CheckpointTokenizer(tmp_path, chat_template=True)
    try:
        out = hf.apply_chat_template(
            _messages(ANSWERED), tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True,
        )  # fmt: skip
    except Exception:
        with pytest.raises(FieldError):
            tok.encode_chat(ANSWERED)
        return
    ids, mask = tok.encode_chat(ANSWERED)
    assert (ids, mask) == (out["input_ids"], out["assistant_masks"]), name
    assert 0 < sum(mask) < len(mask)


def test_most_trl_templates_render_and_a_third_mark_the_assistant():
    assert len(TEMPLATES) >= 38 and len(GENERATION_TEMPLATES) >= 34


@pytest.mark.parametrize("thinking", [False, True])
def test_qwen3s_real_template_takes_enable_thinking_as_transformers(tmp_path, thinking):
    turns = CONVERSATIONS["system and few-shot"]
    hf = _checkpoint(tmp_path, _real_template("qwen3.jinja"))
    tok = CheckpointTokenizer(
        tmp_path, chat_template=True, template_kwargs={"enable_thinking": thinking}
    )
    theirs = hf.apply_chat_template(
        [{"role": r, "content": c} for r, c in turns],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=thinking,
    )
    assert tok.render_conversation(turns) == theirs
    assert ("<think>\n\n</think>" in theirs) == (not thinking)
