"""The one config schema: field paths in errors, presets, overrides, JSON Schema."""

import json

import pytest

from trainer.config import (
    ConfigError,
    apply_overrides,
    json_schema,
    parse_override,
    validate_config,
)
from trainer.presets import PRESETS, preset_dict, resolve_preset


def errors_of(data) -> dict[str, list[str]]:
    with pytest.raises(ConfigError) as info:
        validate_config(data)
    return info.value.as_dict()


def test_defaults_validate():
    cfg = validate_config({})
    assert cfg.model.n_experts == 8 and cfg.algorithm.name == "grpo"
    assert cfg.algorithm.clip_eps_low == 0.2 and cfg.algorithm.clip_eps_high == 0.2


def test_unknown_key_is_named_with_its_path():
    errors = errors_of({"algorithm": {"clip_eps": 0.1}})
    assert list(errors) == ["algorithm.clip_eps"]
    assert "unknown field" in errors["algorithm.clip_eps"][0]


def test_wrong_type_is_rejected_not_coerced():
    errors = errors_of({"run": {"steps": "10"}, "model": {"n_experts": 1.5}})
    assert set(errors) == {"run.steps", "model.n_experts"}


def test_out_of_range_and_cross_field_rules_name_the_field():
    assert "run.seed" in errors_of({"run": {"seed": -1}})
    assert "model.top_k" in errors_of({"model": {"n_experts": 2, "top_k": 3}})
    assert "model.n_heads" in errors_of({"model": {"d_model": 130, "n_heads": 4}})
    errors = errors_of({"model": {"n_experts": 0}, "stabilizers": {"routing_replay": "r3"}})
    assert "stabilizers.routing_replay" in errors
    assert "rollout.max_new_tokens" in errors_of({"rollout": {"max_new_tokens": 1}})


def test_gspo_gets_its_own_clip_range_unless_given():
    cfg = validate_config({"algorithm": {"name": "gspo"}})
    assert (cfg.algorithm.clip_eps_low, cfg.algorithm.clip_eps_high) == (3e-4, 4e-4)
    cfg = validate_config({"algorithm": {"name": "gspo", "clip_eps_low": 1e-3}})
    assert cfg.algorithm.clip_eps_low == 1e-3


def test_every_preset_validates_and_round_trips():
    for name in PRESETS:
        cfg = resolve_preset(name)
        again = validate_config(json.loads(json.dumps(cfg.to_dict())))
        assert again == cfg, name
    assert resolve_preset("dense-grpo").model.n_experts == 0
    assert resolve_preset("moe-grpo-r3").stabilizers.routing_replay == "r3"
    assert resolve_preset("gpu-moe32-grpo").model.n_layers == 12


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError, match="moe-grpo"):
        preset_dict("nope")


def test_overrides_parse_json_then_fall_back_to_strings():
    assert parse_override("run.steps=3") == (["run", "steps"], 3)
    assert parse_override("algorithm.name=gspo") == (["algorithm", "name"], "gspo")
    assert parse_override('task.operations=["add","mul"]') == (
        ["task", "operations"],
        ["add", "mul"],
    )
    data = apply_overrides(
        preset_dict("moe-grpo"), ["run.steps=3", "stabilizers.aux_loss_coef=0.01"]
    )
    cfg = validate_config(data)
    assert cfg.run.steps == 3 and cfg.stabilizers.aux_loss_coef == 0.01
    with pytest.raises(ConfigError):
        parse_override("no-equals-sign")


def test_config_hash_is_stable_and_section_scoped():
    a = validate_config({"run": {"seed": 1}})
    b = validate_config({"run": {"seed": 2}})
    assert a.hash("model", "task") == b.hash("model", "task")
    assert a.hash() != b.hash()


def test_json_schema_has_sections_help_and_forbids_extras():
    schema = json_schema()
    assert set(schema["properties"]) == {
        "model",
        "task",
        "warm_start",
        "rollout",
        "algorithm",
        "stabilizers",
        "optim",
        "run",
    }
    model = schema["$defs"]["ModelConfig"]
    assert model["additionalProperties"] is False
    assert "description" in model["properties"]["n_experts"]
