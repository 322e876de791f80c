"""Who may touch which artifact, and the store calls behind MLflow's artifact API.

MLflow's proxied artifact paths (what ``mlflow-artifacts:`` URIs name):

* ``<experiment>/<run>/artifacts/...``: a run's files (``log_artifact``,
  ``log_dict``, ``log_text``, ``log_figure``, ``log_table``);
* ``<experiment>/models/<model>/artifacts/...``: a logged model's files
  (``mlflow.<flavor>.log_model``, transformers' checkpoints).

Rights are the run's (lab.experiments.rights, ``Run.can_manage``): anyone logged
in reads and lists every artifact; only the run's owner or staff writes or
deletes its files, a logged model's owner or staff its files; nothing else
can be written (the path must name a live run or a logged model of that
experiment). Uploads are bounded by ``LAB_MAX_ARTIFACT_BYTES``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from django.conf import settings

from lab.runs.models import Run
from lab.tracking.artifact_store import BadPath, Entry, TooLarge, artifact_store, clean_path
from lab.tracking.errors import PERMISSION_DENIED, MlflowError, invalid, missing
from lab.tracking.models import LoggedModel

__all__ = ["BadPath", "Entry", "TooLarge"]


@dataclass(frozen=True)
class Owner:
    """What an artifact path belongs to: a run or a logged model (or neither, above
    them: an experiment's or the store's top folders)."""

    run: Run | None = None
    model: LoggedModel | None = None

    def can_write(self, user) -> bool:
        if self.run is not None:
            return self.run.deleted_at is None and self.run.can_manage(user)
        if self.model is not None:
            return bool(user.is_staff or user.pk == self.model.owner_id)
        return False


def path_of(raw: str) -> str:
    try:
        return clean_path(raw)
    except BadPath as exc:
        raise invalid(f"Invalid artifact path: {exc}") from None


def owner_of(path: str) -> Owner:
    """The run or logged model an artifact path lies in; RESOURCE_DOES_NOT_EXIST when
    it names one that does not exist (or one of another experiment)."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[2] == "artifacts" and parts[0].isdigit() and parts[1] != "models":
        run = Run.all_objects.filter(pk=int(parts[1]) if parts[1].isdigit() else -1).first()
        if run is None or str(run.experiment_id) != parts[0]:
            raise missing(f"No run {parts[1]} in experiment {parts[0]}")
        return Owner(run=run)
    if len(parts) >= 4 and parts[1] == "models" and parts[3] == "artifacts":
        model = LoggedModel.objects.filter(model_id=parts[2]).first()
        if model is None or str(model.experiment_id) != parts[0]:
            raise missing(f"No logged model {parts[2]} in experiment {parts[0]}")
        return Owner(model=model)
    return Owner()


def _writable(user, path: str) -> None:
    owner = owner_of(path)
    if owner.run is None and owner.model is None:
        raise MlflowError(
            PERMISSION_DENIED,
            f"{path!r} is not inside a run's or a logged model's artifacts "
            "(<experiment>/<run>/artifacts/... or <experiment>/models/<model>/artifacts/...)",
        )
    if not owner.can_write(user):
        what = f"run {owner.run.pk}" if owner.run is not None else f"model {owner.model.model_id}"
        raise MlflowError(
            PERMISSION_DENIED, f"only the owner of {what} or staff can write its artifacts"
        )


def upload(user, path: str, stream: BinaryIO, length: int) -> int:
    """Store one file (the request body, ``length`` bytes); returns its size."""
    _writable(user, path)
    limit = settings.LAB_MAX_ARTIFACT_BYTES
    try:
        return artifact_store().put(path, stream, length, limit)
    except TooLarge as exc:
        raise invalid(f"Artifact too large: {exc}") from None
    except BadPath as exc:
        raise invalid(f"Invalid artifact upload: {exc}") from None


def download(path: str) -> tuple[Iterator[bytes], int]:
    opened = artifact_store().open(path) if path else None
    if opened is None:
        raise missing(f"No artifact at {path!r}")
    return opened


def listing(path: str) -> list[Entry]:
    return artifact_store().list(path)


def every_file(path: str) -> list[Entry]:
    """Every file at or under ``path``."""
    return artifact_store().walk(path)


def delete(user, path: str) -> None:
    _writable(user, path)
    artifact_store().delete(path)


def run_root(run: Run) -> str:
    return f"{run.experiment_id}/{run.pk}/artifacts"


def model_root(model: LoggedModel) -> str:
    return f"{model.experiment_id}/models/{model.model_id}/artifacts"
