"""MLflow 3's logged models (``/api/2.0/mlflow/logged-models``): what
``mlflow.<flavor>.log_model`` makes before it uploads the model's files to
``mlflow-artifacts:/<experiment>/models/<model_id>/artifacts`` and finalizes it,
as transformers' MLflowCallback does for every checkpoint with
``HF_MLFLOW_LOG_ARTIFACTS=1``. Rights: creating one is adding to the experiment
(its members and staff); changing one is its owner's or staff's. Search uses
MLflow's own utilities (``SearchLoggedModelsUtils``), as runs do.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from lab.experiments.rights import can_queue
from lab.tracking.errors import PERMISSION_DENIED, MlflowError, invalid, missing
from lab.tracking.experiments import get_experiment
from lab.tracking.models import LoggedModel, LoggedModelStatus
from lab.tracking.services import get_run
from lab.tracking.shapes import model_artifact_uri

_BAD_NAME_CHARACTERS = ("/", ":", ".", "%", '"', "'")  # mlflow/utils/validation.py
DEFAULT_SEARCH_RESULTS = 100  # MLflow's SEARCH_LOGGED_MODEL_MAX_RESULTS_DEFAULT
_STATUS_NAMES = {
    "LOGGED_MODEL_PENDING": LoggedModelStatus.PENDING,
    "LOGGED_MODEL_READY": LoggedModelStatus.READY,
    "LOGGED_MODEL_UPLOAD_FAILED": LoggedModelStatus.FAILED,
    "PENDING": LoggedModelStatus.PENDING,
    "READY": LoggedModelStatus.READY,
    "FAILED": LoggedModelStatus.FAILED,
}


def _now_ms() -> int:
    return int(time.time() * 1000)


def get_model(model_id: str) -> LoggedModel:
    model = LoggedModel.objects.filter(model_id=str(model_id), deleted=False).first()
    if model is None:
        raise missing(f"Logged model with ID '{model_id}' not found.")
    return model


def status_of(value: Any) -> str:
    if value not in _STATUS_NAMES:
        raise invalid(f"Invalid value {value!r} for parameter 'status'")
    return _STATUS_NAMES[value]


def create_model(
    *,
    user,
    experiment_id: Any,
    name: str = "",
    model_type: str = "",
    source_run_id: Any = None,
    params: Sequence[tuple[str, str]] = (),
    tags: Sequence[tuple[str, str]] = (),
) -> LoggedModel:
    experiment = get_experiment(experiment_id, user)
    if not can_queue(user, experiment):
        raise MlflowError(
            PERMISSION_DENIED, f"only members of experiment {experiment.pk} and staff add to it"
        )
    if name and any(c in name for c in _BAD_NAME_CHARACTERS):
        raise invalid(
            f"Invalid model name ({name!r}) provided. Model name must be a non-empty string "
            f"and cannot contain the following characters: {_BAD_NAME_CHARACTERS}"
        )
    run = None
    if source_run_id not in (None, ""):
        run, _ = get_run(source_run_id)
    model_id = f"m-{uuid.uuid4().hex}"
    now = _now_ms()
    return LoggedModel.objects.create(
        model_id=model_id,
        experiment=experiment,
        source_run=run,
        owner=user,
        name=name or f"model-{model_id[2:8]}",
        model_type=model_type,
        params=dict(params),
        tags=dict(tags),
        created_ms=now,
        updated_ms=now,
    )


def _for_change(user, model_id: str) -> LoggedModel:
    model = get_model(model_id)
    if not (user.is_staff or user.pk == model.owner_id):
        raise MlflowError(
            PERMISSION_DENIED, f"only the owner of model {model.model_id} or staff can change it"
        )
    return LoggedModel.objects.select_for_update().get(pk=model.pk)


def finalize(*, user, model_id: str, status: str) -> LoggedModel:
    with transaction.atomic():
        model = _for_change(user, model_id)
        model.status = status_of(status)
        model.updated_ms = _now_ms()
        model.save(update_fields=["status", "updated_ms"])
    return model


def set_tags(*, user, model_id: str, tags: Sequence[tuple[str, str]]) -> None:
    with transaction.atomic():
        model = _for_change(user, model_id)
        model.tags.update(dict(tags))
        model.updated_ms = _now_ms()
        model.save(update_fields=["tags", "updated_ms"])


def delete_tag(*, user, model_id: str, key: str) -> None:
    with transaction.atomic():
        model = _for_change(user, model_id)
        if key not in model.tags:
            raise missing(f"No tag with key {key!r} on logged model {model_id}")
        del model.tags[key]
        model.save(update_fields=["tags"])


def log_params(*, user, model_id: str, params: Sequence[tuple[str, str]]) -> None:
    with transaction.atomic():
        model = _for_change(user, model_id)
        model.params.update(dict(params))
        model.save(update_fields=["params"])


def delete_model(*, user, model_id: str) -> None:
    with transaction.atomic():
        model = _for_change(user, model_id)
        model.deleted = True
        model.save(update_fields=["deleted"])


def _entity(model: LoggedModel):
    from mlflow.entities import LoggedModel as MlflowLoggedModel
    from mlflow.entities import LoggedModelStatus as MlflowStatus

    return MlflowLoggedModel(
        experiment_id=str(model.experiment_id),
        model_id=model.model_id,
        name=model.name,
        artifact_location=model_artifact_uri(model),
        creation_timestamp=model.created_ms,
        last_updated_timestamp=model.updated_ms,
        model_type=model.model_type or None,
        source_run_id=str(model.source_run_id) if model.source_run_id else None,
        status=MlflowStatus(model.status.removeprefix("LOGGED_MODEL_").removeprefix("UPLOAD_")),
        tags=dict(model.tags),
        params=dict(model.params),
    )


def search_models(
    *,
    experiment_ids: Sequence[int],
    filter_string: str,
    order_by: list[dict[str, Any]],
    page_token: str,
    max_results: int,
) -> tuple[list[LoggedModel], str | None]:
    """MLflow's SearchLoggedModels over the experiments' logged models."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.search_utils import SearchLoggedModelsUtils

    models = list(LoggedModel.objects.filter(experiment_id__in=list(experiment_ids), deleted=False))
    by_id = {m.model_id: m for m in models}
    try:
        matching = SearchLoggedModelsUtils.filter_logged_models(
            [_entity(m) for m in models], filter_string or None
        )
        ordered = SearchLoggedModelsUtils.sort(matching, order_by or None)
        page, token = SearchLoggedModelsUtils.paginate(ordered, page_token or None, max_results)
    except MlflowException as exc:
        raise invalid(exc.message) from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise invalid(f"Invalid search expression: {exc}") from None
    text = token.decode() if isinstance(token, bytes) else token
    return [by_id[e.model_id] for e in page], text
