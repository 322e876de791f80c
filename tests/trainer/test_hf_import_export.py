"""Importing checkpoints (config errors, shape conflicts, missing files) and
exporting a run's policy back to a folder transformers loads to the same logits."""

from __future__ import annotations

import json

import pytest
import torch
from hf_tiny_checkpoints import save_hf_checkpoint

from trainer.cli import main as cli_main
from trainer.config import ExperimentConfig
from trainer.errors import BAD_INPUT_EXIT_CODE, FieldError
from trainer.hf import build_model, export_hf, resolve_model_source
from trainer.hf.families import model_fields_from_hf
from trainer.model.layers import positions_from_mask
from trainer.validation import validate_config

transformers = pytest.importorskip("transformers")


def _resolve(model: dict) -> ExperimentConfig:
    return resolve_model_source(ExperimentConfig.model_validate({"model": model}))


def _edit_config(folder, **changes):
    path = folder / "config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "rope_parameters.rope_type"),
        ({"rope_parameters": {"rope_type": "su", "factor": 2.0}}, "rope_parameters.rope_type"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
        ({"router_jitter_noise": 0.1}, "router_jitter_noise"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ({"model_type": "qwen3_next"}, "qwen3_next"),
    ],
)
def test_unsupported_checkpoint_fields_are_errors_naming_the_field(tmp_path, changes, named):
    save_hf_checkpoint("mixtral", tmp_path)
    _edit_config(tmp_path, **changes)
    with pytest.raises(FieldError) as exc:
        _resolve({"source": str(tmp_path)})
    messages = exc.value.as_dict()["model.source"]
    assert any(named in m for m in messages), messages


def test_olmoe_clip_qkv_and_olmoe_llama_sliding_windows_are_refused():
    with pytest.raises(FieldError, match="clip_qkv"):
        model_fields_from_hf({"model_type": "olmoe", "clip_qkv": 8.0})
    with pytest.raises(FieldError, match="use_sliding_window"):
        model_fields_from_hf({"model_type": "olmoe", "use_sliding_window": True})
    with pytest.raises(FieldError, match="sliding_window"):
        model_fields_from_hf({"model_type": "llama", "sliding_window": 4096})


def test_shape_fields_conflicting_with_the_checkpoint_are_field_errors(tmp_path):
    save_hf_checkpoint("qwen3_moe", tmp_path)
    with pytest.raises(FieldError) as exc:
        _resolve({"source": str(tmp_path), "n_layers": 5, "top_k": 4})
    assert set(exc.value.as_dict()) == {"model.n_layers", "model.top_k"}
    # The checkpoint's own values (a resolved, stored config) are not a conflict.
    resolved = _resolve({"source": str(tmp_path)})
    again = resolve_model_source(validate_config(resolved.to_dict()))
    assert again.model == resolved.model
    assert resolved.model.n_layers == 3 and resolved.model.n_experts == 8


def test_a_missing_checkpoint_is_a_cli_field_error(tmp_path, capsys):
    code = cli_main(["config", "--set", f"model.source={tmp_path / 'nope'}"])
    assert code == BAD_INPUT_EXIT_CODE
    assert "model.source" in capsys.readouterr().err


def test_a_tensor_the_model_has_no_place_for_is_an_error(tmp_path):
    from safetensors.torch import load_file, save_file

    save_hf_checkpoint("llama", tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    cfg = _resolve({"source": str(tmp_path)}).model
    with pytest.raises(FieldError, match=r"q_proj\.bias"):
        build_model(cfg, cfg.vocab_size)


def _hf_logits(folder, tokens, mask):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(
            input_ids=tokens, attention_mask=mask.long(), position_ids=positions_from_mask(mask)
        ).logits


EXPORTED = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "qwen3")
EXPORTED += ("deepseek_v3", "deepseek_v2", "glm4_moe", "gpt_oss")


@pytest.mark.parametrize("family", EXPORTED)
def test_export_round_trips_through_transformers(family, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    save_hf_checkpoint(family, src)
    (src / "tokenizer.json").write_text('{"marker": 1}')
    cfg = _resolve({"source": str(src)}).model
    model = build_model(cfg, cfg.vocab_size).eval()
    with torch.no_grad():  # a trained policy differs from its source checkpoint
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
        for layer in model.moe_layers:  # and so does a trained correction bias
            if cfg.family in ("deepseek_v3", "glm4_moe"):
                layer.router.selection_bias.add_(torch.randn_like(layer.router.selection_bias))
    export_hf(model.state_dict(), cfg, cfg.vocab_size, out)
    assert (out / "tokenizer.json").read_text() == '{"marker": 1}'
    tokens = torch.randint(0, cfg.vocab_size, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[1, :4] = False
    with torch.no_grad():
        ours = model(tokens, mask).logits
    diff = (ours - _hf_logits(out, tokens, mask))[mask].abs().max().item()
    assert diff < 1e-4, f"{family}: max |logit diff| {diff:.2e}"


def test_builtin_moe_exports_as_mixtral(tmp_path):
    cfg = validate_config({"model": {"n_layers": 2, "d_model": 32, "n_heads": 4}}).model
    torch.manual_seed(0)
    model = build_model(cfg, 40).eval()
    export_hf(model.state_dict(), cfg, 40, tmp_path, max_shard_bytes=60_000)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "mixtral"
    assert (tmp_path / "model.safetensors.index.json").exists()  # sharded
    tokens = torch.randint(0, 40, (1, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad():
        ours = model(tokens, mask).logits
    assert (ours - _hf_logits(tmp_path, tokens, mask)).abs().max().item() < 1e-4


def test_builtin_model_with_learned_positions_cannot_be_exported(tmp_path):
    cfg = validate_config({"model": {"positional": "learned"}}).model
    with pytest.raises(FieldError, match="learned positions"):
        export_hf(build_model(cfg, 40).state_dict(), cfg, 40, tmp_path)


def test_a_selection_bias_a_family_cannot_hold_is_not_exported(tmp_path):
    """An aux-free bias trained on a Qwen3-MoE would be dropped by a qwen3_moe export
    (its checkpoints have no place for it): refused, while DeepSeek-V3 writes it."""
    cfg = validate_config({"model": {"n_layers": 2, "d_model": 32, "n_heads": 4}}).model
    model = build_model(cfg, 40)
    model.moe_layers[0].router.selection_bias[1] = 0.01
    with pytest.raises(FieldError, match="selection bias"):
        export_hf(model.state_dict(), cfg, 40, tmp_path)


def test_reader_gives_the_same_tensors_when_it_remaps_after_every_read(tmp_path):
    from safetensors.torch import load_file

    from trainer.hf.loader import CheckpointReader

    save_hf_checkpoint("olmoe", tmp_path)
    reference = load_file(tmp_path / "model.safetensors")
    reader = CheckpointReader(tmp_path, remap_bytes=1)
    assert reader.keys == set(reference)
    for name, tensor in reference.items():
        assert torch.equal(reader.get(name), tensor)


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ({"shared_expert_hidden": 16}, "a shared expert"),
        ({"family": "mixtral", "qk_norm": "head"}, "qk_norm=head"),
        ({"family": "qwen2_moe"}, "no sigmoid-gated shared expert"),
        ({"family": "olmoe", "qk_norm": "full", "dense_layers": [0]}, "dense blocks"),
        ({"family": "llama"}, "an MoE model"),
        ({"router": {"score": "sigmoid"}}, "a sigmoid router"),
        ({"attention_sinks": True}, "attention sinks"),
        ({"mla": {"enabled": True}}, "latent attention"),
        (
            {"family": "gpt_oss", "attention_sinks": True, "router": {"bias": True}},
            "experts with bias=False",
        ),
        (
            {
                "family": "deepseek_v3",
                "mla": {"enabled": True},
                "router": {"score": "sigmoid"},
                "shared_expert_hidden": 100,
            },
            "multiple of expert_hidden",
        ),
        (
            {
                "family": "glm4_moe",
                "router": {"score": "sigmoid"},
                "shared_expert_hidden": 256,
                "dense_layers": [1],
            },
            "the first k only",
        ),
    ],
)
def test_a_model_its_family_cannot_express_is_not_exported(tmp_path, model, named):
    cfg = validate_config({"model": {"n_layers": 2, "d_model": 32, "n_heads": 4, **model}}).model
    with pytest.raises(FieldError, match=named):
        export_hf(build_model(cfg, 40).state_dict(), cfg, 40, tmp_path)
