"""MLflow's experiment calls on the lab's experiments: get (by id, by name, MLflow's
default "0"), create, rename, delete and restore (soft: ``Experiment.deleted_at``,
its runs with it), and key-value tags (``TrackedExperiment``). Each write is one
transaction; a refusal (``MlflowError``) stores nothing.

Rights are the lab's (lab.experiments.rights): anyone logged in reads; members and
staff set tags; the owner and staff rename, delete and restore.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from lab.experiments.models import Experiment
from lab.experiments.rights import can_queue, can_share
from lab.experiments.services import create_experiment as create_lab_experiment
from lab.runs.models import ACTIVE_STATUSES, Run, RunOrigin
from lab.tracking.errors import (
    PERMISSION_DENIED,
    RESOURCE_ALREADY_EXISTS,
    MlflowError,
    invalid,
    missing,
)
from lab.tracking.models import TrackedExperiment, TrackedRun
from trainer.errors import FieldError

DEFAULT_EXPERIMENT_ID = "0"
DEFAULT_EXPERIMENT_NAME = "Default"


def parse_id(value: Any, field: str) -> int:
    text = str(value if value is not None else "").strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise invalid(f"Invalid value {value!r} for parameter '{field}'")
    return int(text)


def get_experiment(experiment_id: Any, user=None, *, deleted: bool = False) -> Experiment:
    """The experiment with this id (``deleted``: a deleted one too, as MLflow's get
    answers it). MLflow's default experiment, id "0" (where a client that names none
    logs), is the caller's own experiment called "Default", made on first use."""
    if str(experiment_id).strip() == DEFAULT_EXPERIMENT_ID and user is not None:
        return _default_experiment(user)
    pk = parse_id(experiment_id, "experiment_id")
    manager = Experiment.all_objects if deleted else Experiment.objects
    experiment = manager.filter(pk=pk).first()
    if experiment is None:
        raise missing(f"No Experiment with id={experiment_id} exists")
    return experiment


def _default_experiment(user) -> Experiment:
    with transaction.atomic():
        experiment = (
            Experiment.objects.filter(owner=user, name=DEFAULT_EXPERIMENT_NAME)
            .order_by("pk")
            .first()
        )
        if experiment is None:
            experiment = create_lab_experiment(
                owner=user,
                name=DEFAULT_EXPERIMENT_NAME,
                description="Runs logged through the MLflow tracking API without an experiment.",
            )
        return experiment


def get_experiment_by_name(name: str, user) -> Experiment:
    """The experiment called ``name``: the caller's own newest first, else the newest
    (lab experiment names are not unique; MLflow's are), a deleted one last (MLflow
    finds it, and ``set_experiment`` then says to restore it)."""
    named = Experiment.all_objects.filter(name=name).order_by("-deleted_at", "-created_at", "-pk")
    live = named.filter(deleted_at__isnull=True)
    experiment = live.filter(owner=user).first() or live.first() or named.first()
    if experiment is None:
        raise missing(f"Could not find experiment with name '{name}'")
    return experiment


def create_experiment(*, user, name: str, tags: dict[str, str] | None = None) -> Experiment:
    """A new lab experiment owned by ``user`` (default base config: lab runs can be
    queued beside the external ones). MLflow names are unique, deleted experiments'
    included: an existing name is RESOURCE_ALREADY_EXISTS."""
    if not name.strip():
        raise invalid("Invalid experiment name: ''")
    with transaction.atomic():
        if Experiment.all_objects.filter(name=name.strip()).exists():
            raise MlflowError(RESOURCE_ALREADY_EXISTS, f"Experiment(name={name}) already exists.")
        try:
            experiment = create_lab_experiment(
                owner=user,
                name=name,
                description="Runs logged through the MLflow tracking API.",
            )
        except FieldError as exc:
            raise invalid(str(exc)) from None
        if tags:
            TrackedExperiment.objects.create(experiment=experiment, tags=dict(tags))
        return experiment


def experiment_tags(experiment_ids: list[int]) -> dict[int, dict[str, str]]:
    """{experiment id: its MLflow tags} (one query)."""
    return dict(
        TrackedExperiment.objects.filter(experiment_id__in=experiment_ids).values_list(
            "experiment_id", "tags"
        )
    )


def _for_change(user, experiment_id: Any, *, owner_only: bool, deleted: bool = False):
    experiment = get_experiment(experiment_id, user, deleted=deleted)
    allowed = can_share(user, experiment) if owner_only else can_queue(user, experiment)
    if not allowed:
        who = "the owner" if owner_only else "the owner, the groups it is shared with"
        raise MlflowError(
            PERMISSION_DENIED, f"only {who} and staff can change experiment {experiment.pk}"
        )
    return experiment


def set_experiment_tag(*, user, experiment_id: Any, key: str, value: str) -> None:
    with transaction.atomic():
        experiment = _for_change(user, experiment_id, owner_only=False)
        record, _ = TrackedExperiment.objects.select_for_update().get_or_create(
            experiment=experiment
        )
        record.tags[key] = value
        record.save(update_fields=["tags"])


def delete_experiment_tag(*, user, experiment_id: Any, key: str) -> None:
    with transaction.atomic():
        experiment = _for_change(user, experiment_id, owner_only=False)
        record = TrackedExperiment.objects.select_for_update().filter(experiment=experiment).first()
        if record is None or key not in record.tags:
            raise missing(f"No tag with name: {key} in experiment with id {experiment.pk}")
        del record.tags[key]
        record.save(update_fields=["tags"])


def rename_experiment(*, user, experiment_id: Any, new_name: str) -> None:
    """MLflow's experiments/update: a new, unused name."""
    new_name = new_name.strip()
    if not new_name:
        raise invalid("Invalid experiment name: ''")
    if len(new_name) > 200:
        raise invalid(f"Invalid experiment name: at most 200 characters ({len(new_name)} given)")
    with transaction.atomic():
        experiment = _for_change(user, experiment_id, owner_only=True)
        taken = Experiment.all_objects.filter(name=new_name).exclude(pk=experiment.pk)
        if taken.exists():
            raise MlflowError(
                RESOURCE_ALREADY_EXISTS, f"Experiment(name={new_name}) already exists."
            )
        experiment.name = new_name
        experiment.save(update_fields=["name", "updated_at"])


def delete_experiment(*, user, experiment_id: Any) -> None:
    """Soft delete: the experiment and its runs leave every page, with one timestamp
    (so a restore brings back exactly those), until ``restore_experiment``. Refused
    while a lab run of it is queued or training (cancel it first)."""
    with transaction.atomic():
        experiment = _for_change(user, experiment_id, owner_only=True)
        if str(experiment_id).strip() == DEFAULT_EXPERIMENT_ID:
            raise invalid("The default experiment cannot be deleted.")
        active = Run.objects.filter(
            experiment=experiment, origin=RunOrigin.LAB, status__in=ACTIVE_STATUSES
        )
        if active.exists():
            raise invalid(
                f"experiment {experiment.pk} has queued or training lab runs: cancel them first"
            )
        now = timezone.now()
        run_ids = list(Run.objects.filter(experiment=experiment).values_list("pk", flat=True))
        Run.objects.filter(pk__in=run_ids).update(deleted_at=now)
        TrackedRun.objects.filter(run_id__in=run_ids).update(deleted_time=_ms(now))
        experiment.deleted_at = now
        experiment.save(update_fields=["deleted_at", "updated_at"])


def restore_experiment(*, user, experiment_id: Any) -> None:
    """The experiment back, with the runs deleted along with it (runs deleted on their
    own before stay deleted)."""
    with transaction.atomic():
        experiment = _for_change(user, experiment_id, owner_only=True, deleted=True)
        if experiment.deleted_at is None:
            return
        runs = Run.all_objects.filter(experiment=experiment, deleted_at=experiment.deleted_at)
        run_ids = list(runs.values_list("pk", flat=True))
        runs.update(deleted_at=None)
        TrackedRun.objects.filter(run_id__in=run_ids).update(deleted_time=None)
        experiment.deleted_at = None
        experiment.save(update_fields=["deleted_at", "updated_at"])


def _ms(dt) -> int:
    return int(dt.timestamp() * 1000)
