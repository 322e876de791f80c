"""Resolve a run's config from (config | preset | base) + overrides through the
ONE schema (trainer.config), so the form, the API and the CLI agree."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from lab.assets.checks import check_model_source
from lab.assets.prompt_cost import check_config_template
from lab.assets.roots import check_config_paths
from lab.assets.text_files import config_decode_error
from trainer.config import ExperimentConfig, apply_overrides
from trainer.config.presets import preset_dict
from trainer.errors import FieldError
from trainer.hf.tokenizer import checkpoint_task_errors
from trainer.reward_functions import FIELD as REWARD_FIELD
from trainer.reward_functions import permit
from trainer.validation import all_errors

Overrides = list[str] | Mapping[str, Any] | None


def overrides_as_strings(overrides: Overrides) -> list[str]:
    """``{"run.steps": 3}`` or ``["run.steps=3"]`` -> ``["run.steps=3"]`` (JSON values)."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{path}={json.dumps(value)}" for path, value in overrides.items()]
    if not all(isinstance(item, str) for item in overrides):
        raise FieldError([("overrides", "overrides must be 'a.b=value' strings or an object")])
    return list(overrides)


def resolve_config(
    config: Mapping[str, Any] | None = None,
    preset: str | None = None,
    overrides: Overrides = None,
    base: Mapping[str, Any] | None = None,
) -> ExperimentConfig:
    """Validated config from exactly one source plus overrides.

    Precedence of the source: ``config`` > ``preset`` > ``base`` (an experiment's
    base config) > schema defaults. Raises FieldError whose paths name the
    field under ``config.`` (``config.run.steps``), or ``preset``.
    """
    if config is not None and preset:
        raise FieldError([("preset", "give either a config or a preset, not both")])
    if config is not None:
        if not isinstance(config, Mapping):
            raise FieldError([("", "the config must be a JSON object")])
        data = dict(config)
    elif preset:
        data = preset_dict(preset)
    else:
        data = dict(base or {})
    try:
        data = apply_overrides(data, overrides_as_strings(overrides))
        errors = _every_error(data)
    except UnicodeDecodeError as exc:  # the data reader's word for a non-UTF-8 row
        raise config_decode_error(data, exc, f"{CONFIG_PREFIX}.") from None
    except FieldError as exc:
        errors = exc.errors
    if isinstance(errors, ExperimentConfig):
        return errors
    # One namespace for every caller: "config.algorithm.clip_eps_low".
    raise FieldError([(config_path(p), m) for p, m in errors])


def _every_error(data: Mapping[str, Any]) -> ExperimentConfig | list[tuple[str, str]]:
    """The validated config, or every error of every check in one list (a form
    shows them all after one submit): the lab's own checks on the raw data (a
    reward function the lab offers, paths inside LAB_ASSET_ROOTS, a template whose
    format specs cannot blow a prompt up: before anything opens a file), the
    schema with its rules across fields and the task's lengths, and the
    checkpoint a run names, checked like a registration (headers, shapes,
    tokenizer)."""
    errors: list[tuple[str, str]] = []

    def gather(check, *args) -> None:
        try:
            check(*args)
        except FieldError as exc:
            errors.extend(e for e in exc.errors if e not in errors)

    task = data.get("task") if isinstance(data, Mapping) else None
    gather(check_reward_function, task)
    gather(check_config_paths, data)
    gather(check_config_template, data)
    # A refused path or reward function: the schema still speaks, but nothing the
    # config names is opened or imported (the task's length check reads its data).
    refused = bool(errors)
    cfg, schema_errors = (
        all_errors(dict(data), lengths=not refused) if isinstance(data, Mapping) else (None, [])
    )
    errors.extend(e for e in schema_errors if e not in errors)
    model = data.get("model") if isinstance(data, Mapping) else None
    source = model.get("source") if isinstance(model, Mapping) else None
    if cfg is not None and not schema_errors:
        gather(check_reward_function, cfg)  # imports and calls no reward function
    if cfg is not None:
        source = cfg.model.source
    if refused:
        return errors
    if isinstance(source, str) and source and not any(p == "model.source" for p, _ in errors):
        gather(check_model_source, source, "model.source")
    if cfg is not None and source and not any(p == "model.source" for p, _ in errors):
        # ... and the task spoken in the checkpoint's tokens, as the run will check it
        # when it starts: the lengths (rollout.max_new_tokens for the longest answer,
        # model.max_seq_len) and that its tokenizer can write a correct answer.
        errors.extend(e for e in checkpoint_task_errors(cfg) if e not in errors)
    return errors or cfg


def check_reward_function(task: Any, prefix: str = "") -> None:
    """A custom reward function must be one the administrator offers
    (``LAB_REWARD_MODULES``; trainer/reward_functions.py): decided from its name,
    never by importing it. ``task``: the config's task section (a dict as typed, or
    the validated model). FieldError at ``{prefix}task.reward_function``."""
    if isinstance(task, Mapping):
        verifier, name = task.get("verifier"), task.get("reward_function")
    else:
        verifier, name = getattr(task, "verifier", None), getattr(task, "reward_function", None)
    if verifier != "python" or not name:
        return  # the schema names a missing function; only a python verifier runs one
    if not isinstance(name, str):
        raise FieldError([(f"{prefix}{REWARD_FIELD}", "give an import path as text")])
    try:
        permit(name, tuple(settings.LAB_REWARD_MODULES))
    except ValueError as exc:
        raise FieldError([(f"{prefix}{REWARD_FIELD}", str(exc))]) from None


CONFIG_PREFIX = "config"


def config_path(path: str) -> str:
    return f"{CONFIG_PREFIX}.{path}" if path else CONFIG_PREFIX


def strip_config_path(path: str) -> str:
    return path.removeprefix(CONFIG_PREFIX).removeprefix(".")
