"""MLflow's model registry (``/api/2.0/mlflow/registered-models/...``,
``/model-versions/...``): names, versions pointing at a logged model or a run's
files, stages, aliases, tags. Anyone logged in reads and registers a new name;
a registered model and its versions are changed by its owner or staff. Search
uses MLflow's own utilities (``SearchModelUtils``, ``SearchModelVersionUtils``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import Max

from lab.tracking.errors import (
    PERMISSION_DENIED,
    RESOURCE_ALREADY_EXISTS,
    MlflowError,
    invalid,
    missing,
)
from lab.tracking.models import LoggedModel, ModelVersion, RegisteredModel
from lab.tracking.services import get_run
from lab.tracking.shapes import kv, model_artifact_uri

STAGES = {"none": "None", "staging": "Staging", "production": "Production", "archived": "Archived"}


def _now_ms() -> int:
    return int(time.time() * 1000)


# --------------------------------------------------------------------------- shapes


def version_json(mv: ModelVersion) -> dict[str, Any]:
    aliases = [a for a, v in mv.registered_model.aliases.items() if int(v) == mv.version]
    out = {
        "name": mv.registered_model.name,
        "version": str(mv.version),
        "creation_timestamp": mv.created_ms,
        "last_updated_timestamp": mv.updated_ms,
        "user_id": mv.owner.get_username(),
        "current_stage": mv.stage,
        "description": mv.description,
        "source": mv.source,
        "status": mv.status,
        "tags": kv(mv.tags),
        "aliases": sorted(aliases),
    }
    if mv.run_id is not None:
        out["run_id"] = str(mv.run_id)
    if mv.run_link:
        out["run_link"] = mv.run_link
    if mv.model_id:
        out["model_id"] = mv.model_id
    return out


def latest_versions(model: RegisteredModel, stages: Sequence[str] = ()) -> list[ModelVersion]:
    """The newest version in each stage (``stages``: only those; MLflow's
    get-latest-versions), by stage name."""
    wanted = {_stage(s) for s in stages}
    newest: dict[str, ModelVersion] = {}
    for mv in model.versions.select_related("registered_model", "owner").order_by("version"):
        if not wanted or mv.stage in wanted:
            newest[mv.stage] = mv
    return [newest[s] for s in sorted(newest)]


def model_json(model: RegisteredModel) -> dict[str, Any]:
    return {
        "name": model.name,
        "creation_timestamp": model.created_ms,
        "last_updated_timestamp": model.updated_ms,
        "user_id": model.owner.get_username(),
        "description": model.description,
        "latest_versions": [version_json(mv) for mv in latest_versions(model)],
        "tags": kv(model.tags),
        "aliases": [{"alias": a, "version": str(v)} for a, v in sorted(model.aliases.items())],
    }


# --------------------------------------------------------------------------- reads


def get_model(name: str) -> RegisteredModel:
    model = RegisteredModel.objects.select_related("owner").filter(name=name).first()
    if model is None:
        raise missing(f"Registered Model with name={name} not found")
    return model


def get_version(name: str, version: Any) -> ModelVersion:
    text = str(version or "")
    if not (text.isascii() and text.isdigit() and len(text) < 10):
        raise invalid(f"Invalid value {version!r} for parameter 'version'")
    mv = (
        ModelVersion.objects.select_related("registered_model", "owner")
        .filter(registered_model__name=name, version=int(text))
        .first()
    )
    if mv is None:
        raise missing(f"Model Version (name={name}, version={version}) not found")
    return mv


def _logged_model(model_id: str, source: str) -> LoggedModel | None:
    """The logged model a version names (its model_id, or a ``models:/m-...`` source)."""
    if not model_id and source.startswith("models:/m-"):
        model_id = source.removeprefix("models:/").split("/")[0]
    return LoggedModel.objects.filter(model_id=model_id).first() if model_id else None


def download_uri(mv: ModelVersion) -> str:
    """Where the version's files are: its logged model's artifacts, else its source."""
    logged = _logged_model(mv.model_id, mv.source)
    return model_artifact_uri(logged) if logged is not None else mv.source


# --------------------------------------------------------------------------- writes


def _for_change(user, name: str) -> RegisteredModel:
    model = get_model(name)
    if not (user.is_staff or user.pk == model.owner_id):
        raise MlflowError(
            PERMISSION_DENIED, f"only the owner of registered model {name!r} or staff can change it"
        )
    return RegisteredModel.objects.select_for_update().get(pk=model.pk)


def create_model(*, user, name: str, description: str = "", tags=()) -> RegisteredModel:
    if not name.strip():
        raise invalid("Missing value for required parameter 'name'.")
    with transaction.atomic():
        if RegisteredModel.objects.filter(name=name).exists():
            raise MlflowError(
                RESOURCE_ALREADY_EXISTS, f"Registered Model (name={name}) already exists."
            )
        now = _now_ms()
        return RegisteredModel.objects.create(
            name=name,
            owner=user,
            description=description,
            tags=dict(tags),
            created_ms=now,
            updated_ms=now,
        )


def update_model(
    *, user, name: str, description: str | None = None, new_name: str = ""
) -> RegisteredModel:
    with transaction.atomic():
        model = _for_change(user, name)
        if new_name and new_name != name:
            if RegisteredModel.objects.filter(name=new_name).exists():
                raise MlflowError(
                    RESOURCE_ALREADY_EXISTS, f"Registered Model (name={new_name}) already exists."
                )
            model.name = new_name
        if description is not None:
            model.description = description
        model.updated_ms = _now_ms()
        model.save()
    return model


def delete_model(*, user, name: str) -> None:
    with transaction.atomic():
        _for_change(user, name).delete()


def set_model_tag(*, user, name: str, key: str, value: str | None) -> None:
    with transaction.atomic():
        model = _for_change(user, name)
        if value is None:
            if key not in model.tags:
                raise missing(f"No tag with key {key!r} on registered model {name!r}")
            del model.tags[key]
        else:
            model.tags[key] = value
        model.save(update_fields=["tags"])


def set_alias(*, user, name: str, alias: str, version: Any | None) -> None:
    with transaction.atomic():
        model = _for_change(user, name)
        if version is None:
            model.aliases.pop(alias, None)
        else:
            model.aliases[alias] = get_version(name, version).version
        model.save(update_fields=["aliases"])


def create_version(
    *,
    user,
    name: str,
    source: str,
    run_id: Any = None,
    model_id: str = "",
    run_link: str = "",
    description: str = "",
    tags=(),
) -> ModelVersion:
    if not source:
        raise invalid("Missing value for required parameter 'source'.")
    run = get_run(run_id)[0] if run_id not in (None, "") else None
    logged = _logged_model(model_id or "", source)
    if logged is not None:
        model_id = logged.model_id
        if run is None and logged.source_run_id is not None:
            run = logged.source_run  # MLflow takes the run from the logged model
    with transaction.atomic():
        model = _for_change(user, name)
        last = model.versions.aggregate(last=Max("version"))["last"] or 0
        now = _now_ms()
        mv = ModelVersion.objects.create(
            registered_model=model,
            version=last + 1,
            owner=user,
            source=source,
            run=run,
            model_id=model_id,
            run_link=run_link,
            description=description,
            tags=dict(tags),
            created_ms=now,
            updated_ms=now,
        )
        model.updated_ms = now
        model.save(update_fields=["updated_ms"])
    return mv


def update_version(
    *,
    user,
    name: str,
    version: Any,
    description: str | None = None,
    stage: str = "",
    archive_existing: bool = False,
) -> ModelVersion:
    with transaction.atomic():
        _for_change(user, name)
        mv = get_version(name, version)
        if description is not None:
            mv.description = description
        if stage:
            mv.stage = _stage(stage)
            if archive_existing and mv.stage in ("Staging", "Production"):
                ModelVersion.objects.filter(
                    registered_model=mv.registered_model, stage=mv.stage
                ).exclude(pk=mv.pk).update(stage="Archived", updated_ms=_now_ms())
        mv.updated_ms = _now_ms()
        mv.save()
    return mv


def set_version_tag(*, user, name: str, version: Any, key: str, value: str | None) -> None:
    with transaction.atomic():
        _for_change(user, name)
        mv = get_version(name, version)
        if value is None:
            if key not in mv.tags:
                raise missing(f"No tag with key {key!r} on {name} version {version}")
            del mv.tags[key]
        else:
            mv.tags[key] = value
        mv.save(update_fields=["tags"])


def delete_version(*, user, name: str, version: Any) -> None:
    with transaction.atomic():
        model = _for_change(user, name)
        mv = get_version(name, version)
        model.aliases = {a: v for a, v in model.aliases.items() if int(v) != mv.version}
        model.save(update_fields=["aliases"])
        mv.delete()


def _stage(value: str) -> str:
    if str(value).lower() not in STAGES:
        raise invalid(
            f"Invalid Model Version stage: {value}. Value must be one of {', '.join(STAGES.values())}."
        )
    return STAGES[str(value).lower()]


# --------------------------------------------------------------------------- search


def search_models(filter_string: str, order_by: list[str], page_token: str, max_results: int):
    from mlflow.entities.model_registry import RegisteredModel as Entity
    from mlflow.entities.model_registry import RegisteredModelTag
    from mlflow.utils.search_utils import SearchModelUtils

    models = {m.name: m for m in RegisteredModel.objects.select_related("owner")}
    entities = [
        Entity(
            name=m.name,
            creation_timestamp=m.created_ms,
            last_updated_timestamp=m.updated_ms,
            description=m.description,
            tags=[RegisteredModelTag(k, v) for k, v in m.tags.items()],
        )
        for m in models.values()
    ]
    page, token = _searched(
        SearchModelUtils, entities, filter_string, order_by or ["name ASC"], page_token, max_results
    )
    return [models[e.name] for e in page], token


def search_versions(filter_string: str, order_by: list[str], page_token: str, max_results: int):
    from mlflow.entities.model_registry import ModelVersion as Entity
    from mlflow.entities.model_registry import ModelVersionTag
    from mlflow.utils.search_utils import SearchModelVersionUtils

    versions = {
        (mv.registered_model.name, str(mv.version)): mv
        for mv in ModelVersion.objects.select_related("registered_model", "owner")
    }
    entities = [
        Entity(
            name=mv.registered_model.name,
            version=str(mv.version),
            creation_timestamp=mv.created_ms,
            last_updated_timestamp=mv.updated_ms,
            description=mv.description,
            user_id=mv.owner.get_username(),
            current_stage=mv.stage,
            source=mv.source,
            run_id=str(mv.run_id) if mv.run_id else None,
            status=mv.status,
            tags=[ModelVersionTag(k, v) for k, v in mv.tags.items()],
            model_id=mv.model_id or None,
        )
        for mv in versions.values()
    ]
    order = order_by or ["last_updated_timestamp DESC", "name ASC", "version_number DESC"]
    page, token = _searched(
        SearchModelVersionUtils, entities, filter_string, order, page_token, max_results
    )
    return [versions[(e.name, e.version)] for e in page], token


def _searched(utils, entities, filter_string, order_by, page_token, max_results):
    from mlflow.exceptions import MlflowException

    try:
        matching = utils.filter(entities, filter_string or None)
        ordered = utils.sort(matching, order_by)
        page, token = utils.paginate(ordered, page_token or None, max_results)
    except MlflowException as exc:
        raise invalid(exc.message) from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise invalid(f"Invalid search expression: {exc}") from None
    return page, token.decode() if isinstance(token, bytes) else token
