"""The chat templates the supported families really ship, rendered by the lab as
transformers' ``apply_chat_template`` renders them.

The template texts are not copied into this repository: TRL (a test
dependency) ships the released templates of Qwen3 (also Qwen3-MoE's), Qwen2.5
(the Qwen2 family's ChatML, Qwen2-MoE's too) and Llama 3, 3.1 and 3.2 as data,
to recognise a model by its template (trl/chat_templates/README.md). Mixtral's
and OLMoE's are not among them; tests/trainer/test_hf_chat_render.py covers
their constructs (a Mistral-style [INST] template that raises on roles that do
not alternate).
"""

from __future__ import annotations

import json
from importlib import resources

import pytest
from hf_tiny_checkpoints import save_char_tokenizer

from trainer.hf.tokenizer import CheckpointTokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")

# template file in trl/chat_templates -> the families that ship it
REAL_TEMPLATES = {
    "qwen3.jinja": "qwen3, qwen3_moe",
    "qwen2_5.jinja": "qwen2, qwen2_moe",
    "llama3.jinja": "llama (3)",
    "llama3_1.jinja": "llama (3.1)",
    "llama3_2.jinja": "llama (3.2)",
}
CONVERSATIONS = {
    "one question": (("user", "What is 2 + 3?"),),
    "system and few-shot": (
        ("system", "Answer with the number only."),
        ("user", "2+2="),
        ("assistant", "4"),
        ("user", "3+5="),
    ),
}


def _real_template(name: str) -> str:
    return (resources.files("trl") / "chat_templates" / name).read_text()


def _checkpoint(tmp_path, template: str):
    """A character tokenizer with the real template (only the rendered text is
    compared: the template's own markers need not be tokens of it)."""
    save_char_tokenizer(tmp_path)
    plain = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(plain))
    (tmp_path / "chat_template.jinja").write_text(template)
    return transformers.AutoTokenizer.from_pretrained(tmp_path)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("name", REAL_TEMPLATES)
def test_a_real_template_renders_as_transformers(tmp_path, name, conversation):
    turns = CONVERSATIONS[conversation]
    hf = _checkpoint(tmp_path, _real_template(name))
    ours = CheckpointTokenizer(tmp_path, chat_template=True).render_conversation(turns)
    theirs = hf.apply_chat_template(
        [{"role": r, "content": c} for r, c in turns], tokenize=False, add_generation_prompt=True
    )
    assert ours == theirs, REAL_TEMPLATES[name]
    assert turns[-1][1] in ours


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
