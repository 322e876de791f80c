"""The one config schema: field paths in errors, presets, overrides, JSON Schema."""

import json
import warnings
from pathlib import Path

import pytest

from trainer.config import (
    ConfigDeprecationWarning,
    ExperimentConfig,
    apply_overrides,
    json_schema,
    parse_override,
)
from trainer.config.presets import PRESETS, preset_dict, resolve_preset
from trainer.errors import FieldError
from trainer.validation import validate_config


def errors_of(data) -> dict[str, list[str]]:
    with pytest.raises(FieldError) as info:
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
    errors = errors_of({"model": {"n_experts": 0}, "stabilizers": {"replay": {"mode": "r3"}}})
    assert "stabilizers.replay.mode" in errors
    # Nested sub-sections and the task union report the new dotted paths.
    assert "stabilizers.is_correction.mis_low" in errors_of(
        {"stabilizers": {"is_correction": {"mis_low": 3.0}}}
    )
    assert "task.min_len" in errors_of({"task": {"name": "sort", "min_len": 9, "max_len": 4}})
    assert "task.max_value" in errors_of({"task": {"name": "sort", "max_value": "x"}})
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
    assert resolve_preset("moe-grpo-r3").stabilizers.replay.mode == "r3"
    assert resolve_preset("gpu-moe32-grpo").model.n_layers == 12


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(FieldError, match="moe-grpo"):
        preset_dict("nope")


def test_overrides_parse_json_then_fall_back_to_strings():
    assert parse_override("run.steps=3") == (["run", "steps"], 3)
    assert parse_override("algorithm.name=gspo") == (["algorithm", "name"], "gspo")
    assert parse_override('task.operations=["add","mul"]') == (
        ["task", "operations"],
        ["add", "mul"],
    )
    data = apply_overrides(
        preset_dict("moe-grpo"), ["run.steps=3", "stabilizers.balance.aux_loss_coef=0.01"]
    )
    cfg = validate_config(data)
    assert cfg.run.steps == 3 and cfg.stabilizers.balance.aux_loss_coef == 0.01
    with pytest.raises(FieldError):
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
        "parallel",
    }
    model = schema["$defs"]["ModelConfig"]
    assert model["additionalProperties"] is False
    assert "description" in model["properties"]["n_experts"]


# --------------------------------------------------------------------------- old shape
DATA = Path(__file__).parent / "data"


def _validate_old(data) -> tuple[ExperimentConfig, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = validate_config(data)
    return cfg, [str(w.message) for w in caught if w.category is ConfigDeprecationWarning]


def test_presets_saved_in_the_old_shape_still_load_as_the_new_ones():
    """Every preset as the previous release wrote it (flat stabilizers, one task model)."""
    old = json.loads((DATA / "old_shape_presets.json").read_text())
    assert set(old) <= set(PRESETS)  # presets added since (text-grpo) have no old shape
    for name, data in old.items():
        cfg, notes = _validate_old(data)
        expected = resolve_preset(name)
        if name.startswith("gpu-"):  # saved before the gpu presets trained bf16 parameters
            expected = validate_config(
                {
                    **expected.to_dict(),
                    "optim": {**expected.optim.model_dump(), "param_dtype": "fp32"},
                }
            )
        assert cfg == expected, name
        flat = [k for k in data.get("stabilizers", {}) if k != "router_temperature"]
        assert len(notes) >= len(flat), name


def test_old_full_dumps_load_and_name_the_new_paths():
    """A saved experiment holds every field: the other task kind's ones are dropped."""
    new = resolve_preset("moe-grpo-lb-surgery")
    old = json.loads((DATA / "old_shape_presets.json").read_text())["moe-grpo-lb-surgery"]
    old_dump = apply_overrides(
        old,
        ["task.sort_min_len=3", "task.sort_max_len=6", "task.sort_max_value=99",
         "stabilizers.is_correction=\"none\"", "stabilizers.noisy_gating=false",
         "stabilizers.per_expert_grad_clip=0.0"],
    )  # fmt: skip
    cfg, notes = _validate_old(old_dump)
    assert cfg == new
    assert "stabilizers.routing_replay is deprecated; use stabilizers.replay.mode" not in notes
    assert "stabilizers.gradient_surgery is deprecated; use stabilizers.surgery.enabled" in notes
    assert "stabilizers.is_correction is deprecated; use stabilizers.is_correction.kind" in notes
    assert "stabilizers.per_expert_grad_clip is deprecated; use optim.per_expert_grad_clip" in notes
    sort, notes = _validate_old(
        {"task": {"name": "sort", "sort_min_len": 4, "min_digits": 2},
         "model": {"max_seq_len": 96}, "rollout": {"max_new_tokens": 32}}
    )  # fmt: skip
    assert (sort.task.name, sort.task.min_len) == ("sort", 4)
    assert any("task.sort_min_len is deprecated; use task.min_len" in n for n in notes)


def test_old_override_paths_win_over_a_new_shape_preset():
    data = apply_overrides(preset_dict("moe-grpo-r3"), ["stabilizers.routing_replay=none"])
    cfg, notes = _validate_old(data)
    assert cfg.stabilizers.replay.mode == "none"
    assert notes == ["stabilizers.routing_replay is deprecated; use stabilizers.replay.mode"]


def test_old_study_definition_variants_still_resolve():
    study = json.loads((DATA / "old_shape_study_quick.json").read_text())
    for variant in study["variants"]:
        data = apply_overrides(preset_dict(study["base"]["preset"]), variant["set"])
        cfg, _ = _validate_old(data)
        assert cfg.model.n_layers == 2, variant["name"]


def test_algorithm_names_are_the_registry_rows():
    from typing import get_args

    from trainer.algorithms.registry import ALGORITHMS
    from trainer.config import AlgorithmConfig

    names = get_args(AlgorithmConfig.model_fields["name"].annotation)
    assert set(names) == set(ALGORITHMS)
    for name, spec in ALGORITHMS.items():
        cfg = validate_config({"algorithm": {"name": name}})
        assert cfg.algorithm.spec is spec
        assert (cfg.algorithm.clip_eps_low, cfg.algorithm.clip_eps_high) == (
            spec.clip_eps_low,
            spec.clip_eps_high,
        )


def test_gpu_presets_train_bf16_parameters_with_fp32_masters():
    """The gpu-* presets default to bf16 parameters (the sync-free grouped GEMM on
    CUDA is bf16); the tiny CPU presets stay fp32."""
    for name in PRESETS:
        dtype = resolve_preset(name).optim.param_dtype
        assert dtype == ("bf16" if name.startswith("gpu-") else "fp32"), name
