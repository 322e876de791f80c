"""Writes to the registry (each one transaction, the files checked first) and the
run config a registered model or dataset stands for."""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import IntegrityError, transaction

from lab.assets.checks import inspect_checkpoint, inspect_dataset
from lab.assets.models import RegisteredDataset, RegisteredModel, Verifier
from lab.assets.roots import check_path
from lab.text import clean_text
from trainer.errors import FieldError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def _check_name(name: Any, model: type) -> str:
    name = clean_text("name", name, max_length=100, required=True)
    if not NAME.match(name):
        raise FieldError(
            [("name", "use letters, digits, '.', '_' and '-' (a letter or digit first)")]
        )
    if model.objects.filter(name=name).exists():
        raise FieldError([("name", f"{name!r} is already registered; pick another name")])
    return name


def _create(model: type, **fields: Any):
    """Insert; a name taken by a concurrent registration is the same field error."""
    try:
        with transaction.atomic():  # a savepoint: the caller's transaction stays usable
            return model.objects.create(**fields)
    except IntegrityError:
        raise FieldError(
            [("name", f"{fields['name']!r} is already registered; pick another name")]
        ) from None


def _check_path(path: Any, *, shipped_names: bool = False) -> str:
    """A path inside LAB_ASSET_ROOTS (``roots.check_path``, the one check every
    path a user names goes through), before anything opens it."""
    path = clean_text("path", path, max_length=1000, required=True)
    return check_path("path", path, shipped_names=shipped_names)


@transaction.atomic
def register_model(*, owner, name: str, path: str, description: str = "") -> RegisteredModel:
    """Check the checkpoint folder (``checks.inspect_checkpoint``) and store it."""
    name = _check_name(name, RegisteredModel)
    path = _check_path(path)
    description = clean_text("description", description, max_length=5000, multiline=True)
    facts = inspect_checkpoint(path)
    return _create(
        RegisteredModel,
        name=name,
        path=path,
        family=facts.family,
        model_fields=facts.model_fields,
        total_params=facts.total_params,
        active_params=facts.active_params,
        vocab_size=facts.vocab_size,
        description=description,
        owner=owner,
    )


@transaction.atomic
def register_dataset(
    *,
    owner,
    name: str,
    path: str,
    prompt_field: str = "question",
    answer_field: str = "answer",
    prompt_template: str = "",
    verifier: str = Verifier.NUMERIC,
    description: str = "",
) -> RegisteredDataset:
    """Check the data file (``checks.inspect_dataset``) and store it."""
    name = _check_name(name, RegisteredDataset)
    path = _check_path(path, shipped_names=True)
    prompt_field = clean_text("prompt_field", prompt_field, max_length=100, required=True)
    answer_field = clean_text("answer_field", answer_field, max_length=100, required=True)
    prompt_template = clean_text(
        "prompt_template", prompt_template, max_length=5000, multiline=True
    )
    if verifier not in Verifier.values:
        raise FieldError([("verifier", f"choose one of: {', '.join(Verifier.values)}")])
    description = clean_text("description", description, max_length=5000, multiline=True)
    facts = inspect_dataset(path, prompt_field, answer_field, prompt_template, verifier)
    return _create(
        RegisteredDataset,
        name=name,
        path=path,
        prompt_field=prompt_field,
        answer_field=answer_field,
        prompt_template=prompt_template,
        verifier=verifier,
        rows=facts.rows,
        problems=facts.problems,
        skipped=facts.skipped,
        description=description,
        owner=owner,
    )


def model_overrides(model: RegisteredModel) -> list[str]:
    """``model.source`` and the checkpoint's shape fields (as the trainer resolves
    them), so a run's stored config shows the model before a worker reads it."""
    fields = {"source": model.path, **model.model_fields}
    return [f"model.{key}={json.dumps(value)}" for key, value in fields.items()]


def dataset_overrides(dataset: RegisteredDataset) -> list[str]:
    """A text task on the dataset's file (the whole task section is replaced)."""
    task = {
        "name": "text",
        "data_file": dataset.path,
        "prompt_field": dataset.prompt_field,
        "answer_field": dataset.answer_field,
        "prompt_template": dataset.prompt_template or None,
        "verifier": dataset.verifier,
    }
    return [f"task={json.dumps(task)}"]


def asset_overrides(
    model: RegisteredModel | None = None, dataset: RegisteredDataset | None = None
) -> list[str]:
    return (model_overrides(model) if model else []) + (
        dataset_overrides(dataset) if dataset else []
    )


def picked_assets(form: Any) -> list[str]:
    """Overrides for the run form's ``registered_model`` / ``registered_dataset`` choices
    (names; empty = none); FieldError naming the choice when it is not registered."""
    picked: dict[str, Any] = {}
    for field, model in (
        ("registered_model", RegisteredModel),
        ("registered_dataset", RegisteredDataset),
    ):
        name = (form.get(field) or "").strip()
        if name:
            picked[field] = model.objects.filter(name=name).first()
            if picked[field] is None:
                raise FieldError([(field, f"{name!r} is not registered")])
    return asset_overrides(picked.get("registered_model"), picked.get("registered_dataset"))
