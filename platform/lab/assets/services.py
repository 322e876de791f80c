"""Writes to the registry (each one transaction, the files checked first) and the
run config a registered model or dataset stands for."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from lab.assets.checks import check_weights, inspect_checkpoint, inspect_dataset
from lab.assets.models import DatasetStatus, RegisteredDataset, RegisteredModel, Verifier
from lab.assets.roots import check_path
from lab.text import clean_text
from trainer.errors import FieldError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
CHECK_DATASET_TASK = "assets.check_dataset"
CHECK_MODEL_TASK = "assets.check_model"
CHECK_QUEUE = "control"  # the reconciler's worker, live in every deployment
log = logging.getLogger("lab.assets")


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
    """Check the checkpoint folder (``checks.inspect_checkpoint``: headers, dtypes,
    tokenizer, chat template) and every weight for NaN and Inf (``checks.check_weights``),
    then store it. A checkpoint over ``LAB_MODEL_INLINE_BYTES`` of weights is stored as
    "checking" and its weights are scanned by the control queue's worker
    (``check_model``), never inside the web request."""
    name = _check_name(name, RegisteredModel)
    path = _check_path(path)
    description = clean_text("description", description, max_length=5000, multiline=True)
    facts = inspect_checkpoint(path)
    fields = dict(
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
    if facts.weight_bytes > settings.LAB_MODEL_INLINE_BYTES:
        model = _create(RegisteredModel, status=DatasetStatus.CHECKING, **fields)
        transaction.on_commit(lambda: _publish_check(CHECK_MODEL_TASK, RegisteredModel, model.pk))
        return model
    check_weights(path)
    return _create(RegisteredModel, **fields)


def check_model(model_id: int) -> str:
    """The control worker's side: scan the weights of a model still "checking" and mark
    it ready, or failed with the tensors that hold NaN or Inf. Idempotent, as
    ``check_dataset``."""
    model = RegisteredModel.objects.filter(pk=model_id).first()
    if model is None or model.status != DatasetStatus.CHECKING:
        return "skipped"
    checking = RegisteredModel.objects.filter(pk=model_id, status=DatasetStatus.CHECKING)
    try:
        check_weights(model.path)
    except FieldError as exc:
        message = "; ".join(f"{path}: {text}" for path, text in exc.errors)
        checking.update(status=DatasetStatus.FAILED, error=message[:4000])
        return DatasetStatus.FAILED
    checking.update(status=DatasetStatus.READY, error="")
    log.info("model %s checked: every weight finite", model_id)
    return DatasetStatus.READY


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
    """Check the data file (``checks.inspect_dataset``) and store it. A file larger
    than ``LAB_DATASET_INLINE_BYTES`` is stored as "checking" and checked by the
    control queue's worker (``check_dataset``), never inside the web request."""
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
    fields = dict(
        name=name,
        path=path,
        prompt_field=prompt_field,
        answer_field=answer_field,
        prompt_template=prompt_template,
        verifier=verifier,
        description=description,
        owner=owner,
    )
    if _file_size(path) > settings.LAB_DATASET_INLINE_BYTES:
        dataset = _create(RegisteredDataset, status=DatasetStatus.CHECKING, **fields)
        transaction.on_commit(
            lambda: _publish_check(CHECK_DATASET_TASK, RegisteredDataset, dataset.pk)
        )
        return dataset
    facts = inspect_dataset(path, prompt_field, answer_field, prompt_template, verifier)
    return _create(
        RegisteredDataset,
        rows=facts.rows,
        problems=facts.problems,
        skipped=facts.skipped,
        **fields,
    )


def _file_size(path: str) -> int:
    """The data file's size (a shipped name resolves to the file the lab ships); a file
    that is missing is left to ``inspect_dataset``'s field error (size 0)."""
    from trainer.tasks.text_data import SHIPPED_DATA

    candidate = Path(path) if Path(path).is_absolute() else SHIPPED_DATA / path
    try:
        return candidate.stat().st_size
    except OSError:
        return 0


def _publish_check(task: str, model: type, pk: int) -> None:
    """Send a check to the control queue; a broker that refuses fails the dataset or
    model with the reason (registering it again retries)."""
    from celery import (
        current_app as app,
    )  # lab.site.celery's app (design.md 1.2)

    try:
        app.send_task(task, args=[pk], queue=CHECK_QUEUE, retry=False)
    except Exception as exc:  # kombu/redis raise many types for "broker down"
        model.objects.filter(pk=pk, status=DatasetStatus.CHECKING).update(
            status=DatasetStatus.FAILED, error=f"could not queue the check: {exc}"
        )


def check_dataset(dataset_id: int) -> str:
    """The control worker's side: read the file of a dataset still "checking" and store
    what it holds (ready), or why it is refused (failed). Idempotent: a dataset no
    longer checking (a repeated delivery) is left as it is; a worker lost mid-check
    leaves it checking, and the redelivered message checks it again."""
    dataset = RegisteredDataset.objects.filter(pk=dataset_id).first()
    if dataset is None or dataset.status != DatasetStatus.CHECKING:
        return "skipped"
    try:
        facts = inspect_dataset(
            dataset.path,
            dataset.prompt_field,
            dataset.answer_field,
            dataset.prompt_template,
            dataset.verifier,
        )
    except FieldError as exc:
        message = "; ".join(f"{path}: {text}" for path, text in exc.errors)
        RegisteredDataset.objects.filter(pk=dataset_id, status=DatasetStatus.CHECKING).update(
            status=DatasetStatus.FAILED, error=message[:4000]
        )
        return DatasetStatus.FAILED
    RegisteredDataset.objects.filter(pk=dataset_id, status=DatasetStatus.CHECKING).update(
        status=DatasetStatus.READY,
        rows=facts.rows,
        problems=facts.problems,
        skipped=facts.skipped,
        error="",
    )
    log.info("dataset %s checked: %s problems of %s rows", dataset_id, facts.problems, facts.rows)
    return DatasetStatus.READY


def model_overrides(model: RegisteredModel, field: str = "model") -> list[str]:
    """``model.source`` and the checkpoint's shape fields (as the trainer resolves
    them), so a run's stored config shows the model before a worker reads it; a
    FieldError on ``field`` while its weights are being scanned, or after the scan
    refused them."""
    if model.status == DatasetStatus.CHECKING:
        raise FieldError([(field, f"{model.name!r} is still being checked; try again soon")])
    if model.status == DatasetStatus.FAILED:
        raise FieldError([(field, f"{model.name!r} failed its check: {model.error}")])
    fields = {"source": model.path, **model.model_fields}
    return [f"model.{key}={json.dumps(value)}" for key, value in fields.items()]


def dataset_overrides(dataset: RegisteredDataset, field: str = "dataset") -> list[str]:
    """A text task on the dataset's file (the whole task section is replaced); a
    FieldError on ``field`` (the request's name for the choice) while the file is
    still being checked, or after its check failed."""
    if dataset.status == DatasetStatus.CHECKING:
        raise FieldError([(field, f"{dataset.name!r} is still being checked; try again soon")])
    if dataset.status == DatasetStatus.FAILED:
        raise FieldError([(field, f"{dataset.name!r} failed its check: {dataset.error}")])
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
    model: RegisteredModel | None = None,
    dataset: RegisteredDataset | None = None,
    dataset_field: str = "dataset",
    model_field: str = "model",
) -> list[str]:
    return (model_overrides(model, model_field) if model else []) + (
        dataset_overrides(dataset, dataset_field) if dataset else []
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
    return asset_overrides(
        picked.get("registered_model"),
        picked.get("registered_dataset"),
        "registered_dataset",
        "registered_model",
    )
