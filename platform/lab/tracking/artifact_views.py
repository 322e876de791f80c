"""MLflow's artifact API in proxied mode, the endpoints the MLflow client calls for an
``mlflow-artifacts:`` URI (mlflow/store/artifact/mlflow_artifacts_repo.py):

* ``PUT /api/2.0/mlflow-artifacts/artifacts/<path>``: upload one file (the body);
* ``GET /api/2.0/mlflow-artifacts/artifacts/<path>``: download it;
* ``GET /api/2.0/mlflow-artifacts/artifacts?path=<folder>``: list a folder;
* ``DELETE /api/2.0/mlflow-artifacts/artifacts/<path>``: delete;

and the tracking server's listings for a run (``/api/2.0/mlflow/artifacts/list``)
and a logged model (``/logged-models/<id>/artifacts/directories``). Rights and
bounds: tracking/artifacts.py.
"""

from __future__ import annotations

import mimetypes
import posixpath
from typing import Any

from django.http import StreamingHttpResponse

from lab.tracking import artifacts, logged_models, services
from lab.tracking.errors import invalid
from lab.tracking.http import endpoint, run_id_of
from lab.tracking.shapes import run_artifact_uri


def _files(entries: list[artifacts.Entry], relative_to: str) -> dict[str, Any]:
    files = []
    for entry in entries:
        rel = posixpath.relpath(entry.path, relative_to) if relative_to else entry.path
        item: dict[str, Any] = {"path": rel, "is_dir": entry.is_dir}
        if not entry.is_dir:
            item["file_size"] = entry.size
        files.append(item)
    return {"files": files} if files else {}


@endpoint("GET", "PUT", "DELETE", raw_body=True)
def artifact(request, user, body, artifact_path: str):
    path = artifacts.path_of(artifact_path)
    if request.method == "PUT":
        length = request.META.get("CONTENT_LENGTH") or ""
        if not (length.isascii() and length.isdigit()):
            raise invalid("An artifact upload needs a Content-Length header")
        artifacts.upload(user, path, request, int(length))
        return {}
    if request.method == "DELETE":
        artifacts.delete(user, path)
        return {}
    chunks, size = artifacts.download(path)
    kind, _ = mimetypes.guess_type(path)
    response = StreamingHttpResponse(chunks, content_type=kind or "application/octet-stream")
    response["Content-Length"] = str(size)
    response["Content-Disposition"] = f'attachment; filename="{posixpath.basename(path)}"'
    return response


@endpoint("GET")
def artifact_list(request, user, body):
    path = artifacts.path_of(str(body.get("path") or ""))
    return _files(artifacts.listing(path), path)


@endpoint("GET")
def run_artifact_list(request, user, body):
    """MLflow's ListArtifacts: a folder of a run's artifacts, paths relative to the run's
    artifact root."""
    run, _ = services.get_run(run_id_of(body))
    root = artifacts.run_root(run)
    sub = artifacts.path_of(str(body.get("path") or ""))
    listed = _files(artifacts.listing(posixpath.join(root, sub) if sub else root), root)
    return {"root_uri": run_artifact_uri(run), **listed}


@endpoint("GET")
def model_artifact_directories(request, user, body, model_id: str):
    model = logged_models.get_model(model_id)
    root = artifacts.model_root(model)
    sub = artifacts.path_of(str(body.get("artifact_directory_path") or ""))
    return _files(artifacts.listing(posixpath.join(root, sub) if sub else root), root)
