"""What the run page shows of a run trained elsewhere (lab.tracking): its parent and
child runs (MLflow's nested runs), its artifacts and logged models (the files and
checkpoints its client uploaded), its system metrics (MLflow's ``system/*``), the
distributions imported from TensorBoard histograms, and what an import could not
store, with the reason. Reads only; one query per kind."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from lab.runs.models import Run
from lab.tracking import artifacts
from lab.tracking.models import LoggedModel, TrackedRun

log = logging.getLogger("dashboard")
SYSTEM_PREFIX = "system/"  # MLflow's system metrics (mlflow/system_metrics)
MAX_FILES_LISTED = 500


@dataclass
class ArtifactFolder:
    """Files under one artifact root: (path relative to the root, size) each."""

    root: str
    files: list[tuple[str, int | None]] = field(default_factory=list)
    more: int = 0  # files past MAX_FILES_LISTED, not listed

    @property
    def total_bytes(self) -> int:
        return sum(size or 0 for _, size in self.files)


@dataclass
class ExternalFacts:
    parent: Run | None
    children: list[Run]
    artifacts: ArtifactFolder | None
    models: list[tuple[LoggedModel, ArtifactFolder | None]]
    system_keys: list[str]
    distributions: list[str]
    notes: list[dict[str, Any]]
    storage_error: str = ""


def _folder(root: str) -> ArtifactFolder:
    entries = artifacts.every_file(root)
    prefix = root + "/"
    files = [(e.path.removeprefix(prefix), e.size) for e in entries[:MAX_FILES_LISTED]]
    return ArtifactFolder(root, files, max(0, len(entries) - MAX_FILES_LISTED))


def external_facts(run: Run) -> ExternalFacts | None:
    """The facts above for an external run, None for a lab run."""
    if not run.is_external:
        return None
    tracked = TrackedRun.objects.select_related("parent").filter(run_id=run.pk).first()
    if tracked is None:
        return None
    children = list(
        Run.objects.filter(
            pk__in=TrackedRun.objects.filter(parent_id=run.pk).values("run_id")
        ).order_by("pk")
    )
    models = list(LoggedModel.objects.filter(source_run=run, deleted=False).order_by("created_ms"))
    storage_error = ""
    try:
        folder = _folder(artifacts.run_root(run))
        listed = [(m, _folder(artifacts.model_root(m))) for m in models]
    except Exception as exc:  # the store unreachable (a disk, S3): say so, show the rest
        log.warning("run %s: artifact store: %s", run.pk, exc)
        storage_error = f"the artifact store could not be read: {exc}"
        folder, listed = None, [(m, None) for m in models]
    parent = tracked.parent if tracked.parent and tracked.parent.deleted_at is None else None
    return ExternalFacts(
        parent=parent,
        children=children,
        artifacts=folder,
        models=listed,
        system_keys=sorted(k for k in tracked.latest_metrics if k.startswith(SYSTEM_PREFIX)),
        distributions=list(tracked.distributions),
        notes=list(tracked.import_notes),
        storage_error=storage_error,
    )
