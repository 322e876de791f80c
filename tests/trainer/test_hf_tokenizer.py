"""The checkpoint's tokenizer.json behind the tasks' tokenizer interface."""

from __future__ import annotations

import json

import pytest
from hf_tiny_checkpoints import save_char_tokenizer

from trainer.config import ModelConfig
from trainer.errors import FieldError
from trainer.hf.tokenizer import CheckpointTokenizer, checkpoint_tokenizer
from trainer.tasks.tokenizer import CharTokenizer

pytest.importorskip("tokenizers")


def test_encode_decode_round_trip_with_specials(tmp_path):
    save_char_tokenizer(tmp_path)
    tok = CheckpointTokenizer(tmp_path)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    ids = tok.encode("37+58=", bos=True, eos=True)
    assert ids == CharTokenizer().encode("37+58=", bos=True, eos=True)
    # Stops at EOS, skips pads and BOS, ignores ids past the tokenizer's vocabulary.
    assert tok.decode([0, *ids, 90, 5]) == "37+58="
    assert tok.decode([1, 6, 95, 10]) == "37"


def test_missing_specials_fall_back_to_config_ids_and_eos_padding(tmp_path):
    save_char_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    tok = CheckpointTokenizer(tmp_path)
    assert tok.eos_id == 2 and tok.pad_id == 2 and tok.bos_id is None
    assert tok.encode("12", bos=True) == [1, 4, 5]  # tokenizer.json's post-processor


def test_generation_config_eos_lists_end_responses_too(tmp_path):
    """Llama 3.1 Instruct and Qwen3 list several EOS ids in generation_config.json;
    transformers' generate stops at any of them, and so do rollouts and decode."""
    save_char_tokenizer(tmp_path)
    assert CheckpointTokenizer(tmp_path).stop_ids == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2, 9]}))
    tok = CheckpointTokenizer(tmp_path)
    assert tok.eos_id == 2 and tok.stop_ids == (2, 7, 9)
    assert tok.decode([5, 6, 9, 8]) == "23"  # cut at the listed id 9
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 6}))
    assert CheckpointTokenizer(tmp_path).stop_ids == (2, 6)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 10**6]}))
    with pytest.raises(FieldError, match="eos_token_id 1000000 is not a token id"):
        CheckpointTokenizer(tmp_path)


def test_a_checkpoint_without_tokenizer_is_a_field_error_for_runs(tmp_path):
    cfg = ModelConfig(source=str(tmp_path), family="llama")
    with pytest.raises(FieldError, match=r"no tokenizer\.json"):
        checkpoint_tokenizer(cfg)
    assert checkpoint_tokenizer(ModelConfig()) is None


def test_cli_run_on_a_checkpoint_without_tokenizer_exits_2_and_writes_nothing(tmp_path, capsys):
    from hf_tiny_checkpoints import save_hf_checkpoint

    from trainer.cli import main as cli_main
    from trainer.errors import BAD_INPUT_EXIT_CODE

    pytest.importorskip("transformers")
    save_hf_checkpoint("llama", tmp_path / "src")
    out = tmp_path / "run"
    args = ["run", "--preset", "moe-grpo", "--set", f"model.source={tmp_path / 'src'}"]
    assert cli_main([*args, "--out", str(out)]) == BAD_INPUT_EXIT_CODE
    assert "tokenizer.json" in capsys.readouterr().err
    assert not out.exists()


CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_chat_template_renders_like_transformers_apply_chat_template(tmp_path):
    transformers = pytest.importorskip("transformers")
    save_char_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = CHATML
    config["eos_token"] = "<eos>"  # transformers 5 wants plain strings here
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = CheckpointTokenizer(tmp_path, chat_template=True).render_prompt("12+3=")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    theirs = hf.apply_chat_template(
        [{"role": "user", "content": "12+3="}], tokenize=False, add_generation_prompt=True
    )
    assert ours == theirs == "<|im_start|>user\n12+3=<|im_end|>\n<|im_start|>assistant\n"


def test_prompts_go_through_the_template_and_targets_do_not(tmp_path):
    save_char_tokenizer(tmp_path)
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}|{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    tok = CheckpointTokenizer(tmp_path, chat_template=True)
    char = CharTokenizer()
    assert tok.encode("1+2=", bos=True) == char.encode("user: 1+2=|assistant:", bos=True)
    assert tok.encode("3", bos=False, eos=True) == char.encode("3", bos=False, eos=True)


def test_chat_template_needs_a_checkpoint_and_a_template(tmp_path):
    with pytest.raises(FieldError) as exc:
        from trainer.validation import validate_config

        validate_config({"model": {"chat_template": True}})
    assert "model.chat_template" in exc.value.as_dict()
    save_char_tokenizer(tmp_path)
    with pytest.raises(FieldError, match="no chat template"):
        CheckpointTokenizer(tmp_path, chat_template=True)
