"""Each family's config-class defaults: a checkpoint whose config.json omits a
key gets what transformers' own config class gives it (the table in
``trainer.hf.families.FAMILY_DEFAULTS`` against ``XConfig()``), and a trimmed
config imports to transformers' logits. Scaled rope and sliding windows export
back to configs transformers reads as the same model."""

from __future__ import annotations

import json

import pytest
import torch
from hf_tiny_checkpoints import hf_classes, save_hf_checkpoint

from trainer.config import ExperimentConfig
from trainer.hf import build_model, export_hf, resolve_model_source
from trainer.hf.families import FAMILIES, FAMILY_DEFAULTS
from trainer.model.layers import positions_from_mask

transformers = pytest.importorskip("transformers")


def _import(folder):
    cfg = ExperimentConfig.model_validate({"model": {"source": str(folder), "max_seq_len": 64}})
    model_cfg = resolve_model_source(cfg).model
    return model_cfg, build_model(model_cfg, model_cfg.vocab_size).eval()


def _class_value(config, key):
    if key in ("rope_theta", "partial_rotary_factor"):
        return config.rope_parameters[key]
    if key == "rope_parameters":  # the table keeps the base under rope_theta
        return {k: v for k, v in config.rope_parameters.items() if k != "rope_theta"}
    if key == "num_experts" and not hasattr(config, key):
        return config.num_local_experts
    return getattr(config, key, None)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_defaults_equal_the_transformers_config_class(family):
    config_cls, _ = hf_classes(family)
    config = config_cls()
    for key, value in FAMILY_DEFAULTS[family].items():
        if value is None:  # derived from other keys (kv heads = heads, head_dim = d / heads)
            continue
        if key == "sliding_window" and family != "mixtral":
            # the class keeps the raw default only while use_sliding_window is off
            config = config_cls(use_sliding_window=True)
        theirs = _class_value(config, key)
        assert theirs == value, f"{family}.{key}: transformers {theirs!r}, lab {value!r}"


def _logits(model_cfg, model, hf, length=12):
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, model_cfg.vocab_size, (2, length), generator=gen)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[0, :2] = False
    with torch.no_grad():
        ours = model(tokens, mask).logits
        theirs = hf(
            input_ids=tokens, attention_mask=mask.long(), position_ids=positions_from_mask(mask)
        ).logits
    return (ours - theirs)[mask].abs().max().item()


@pytest.mark.parametrize(
    ("family", "trimmed"),
    [
        ("mixtral", ("rope_theta", "rope_parameters", "rms_norm_eps")),
        ("olmoe", ("rms_norm_eps", "num_key_value_heads")),
        ("qwen3", ("rms_norm_eps",)),
    ],
)
def test_a_trimmed_config_imports_as_transformers_reads_it(family, trimmed, tmp_path):
    save_hf_checkpoint(family, tmp_path, num_key_value_heads=4)
    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    for key in trimmed:
        data.pop(key, None)
    path.write_text(json.dumps(data))
    _, model_cls = hf_classes(family)
    hf = model_cls.from_pretrained(tmp_path).eval()
    cfg, model = _import(tmp_path)
    assert cfg.norm_eps == hf.config.rms_norm_eps
    assert cfg.rope_theta == hf.config.rope_parameters["rope_theta"]
    assert _logits(cfg, model, hf) < 1e-4


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("qwen3_moe", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                        "original_max_position_embeddings": 16}}),
        ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 16}}),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}),
        ("mixtral", {"sliding_window": 5}),
    ],
)  # fmt: skip
def test_scaled_rope_and_windows_export_to_the_same_model(family, overrides, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    save_hf_checkpoint(family, src, **overrides)
    cfg, model = _import(src)
    export_hf(model.state_dict(), cfg, cfg.vocab_size, out)
    _, model_cls = hf_classes(family)
    hf = model_cls.from_pretrained(out).eval()
    assert _logits(cfg, model, hf, length=24) < 1e-4
    again, _ = _import(out)
    assert again.rope_scaling == cfg.rope_scaling
    assert (again.sliding_window, again.sliding_layers) == (cfg.sliding_window, cfg.sliding_layers)
