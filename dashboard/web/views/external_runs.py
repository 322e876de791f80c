"""What the run page offers of a run trained elsewhere, beyond its charts: its artifact
files and logged models (checkpoints) as downloads, a folder or a model as one zip
streamed as it is read, and its distribution panels (imported TensorBoard
histograms). Anyone logged in reads them, as every run (lab.experiments.rights)."""

from __future__ import annotations

import posixpath
import zipfile
from collections.abc import Iterator

from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404

from dashboard.charts.figures.distribution import distribution_bands
from dashboard.review import queries as q
from dashboard.web.views.endpoints import chart_response, login_required_json
from dashboard.web.views.page_common import page_params
from dashboard.web.views.params import RunChartQuery, parse
from lab.runs.models import Run
from lab.tracking import artifacts
from lab.tracking.artifact_store import BadPath, clean_path
from lab.tracking.errors import MlflowError
from lab.tracking.models import LoggedModel


class _Pipe:
    """A write-only stream whose bytes are taken out as they come (zipfile writes a
    non-seekable stream with data descriptors)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.chunks.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out, self.chunks = b"".join(self.chunks), []
        return out


def zip_stream(root: str, files: list[artifacts.Entry]) -> Iterator[bytes]:
    """The files under ``root`` as one zip (paths relative to ``root``), streamed."""
    pipe = _Pipe()
    with zipfile.ZipFile(pipe, "w", compression=zipfile.ZIP_STORED) as archive:
        for entry in files:
            name = posixpath.relpath(entry.path, root) if root else entry.path
            with archive.open(zipfile.ZipInfo(name), "w", force_zip64=True) as member:
                chunks, _ = artifacts.download(entry.path)
                for chunk in chunks:
                    member.write(chunk)
                    yield pipe.take()
        yield pipe.take()
    yield pipe.take()


def _download(root: str, relative: str, name: str) -> HttpResponse:
    try:
        path = clean_path(posixpath.join(root, relative)) if relative else root
    except BadPath as exc:
        raise Http404(str(exc)) from None
    if not (path == root or path.startswith(root + "/")):
        raise Http404("not an artifact of this run")
    files = artifacts.every_file(path)
    if not files:
        raise Http404("no such artifact")
    if len(files) == 1 and files[0].path == path:  # one file: as it is
        chunks, size = artifacts.download(path)
        response = StreamingHttpResponse(chunks, content_type="application/octet-stream")
        response["Content-Length"] = str(size)
        response["Content-Disposition"] = f'attachment; filename="{posixpath.basename(path)}"'
        return response
    response = StreamingHttpResponse(zip_stream(path, files), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{name}.zip"'
    return response


@page_params
def run_artifact(request: HttpRequest, run_id: int) -> HttpResponse:
    """``?path=``: one file of the run's artifacts, or a folder (all of them: no path)
    as a zip."""
    run = get_object_or_404(Run, pk=run_id)
    relative = request.GET.get("path", "")
    try:
        return _download(artifacts.run_root(run), relative, f"run-{run.pk}-artifacts")
    except MlflowError as exc:
        raise Http404(exc.message) from None


@page_params
def run_model(request: HttpRequest, run_id: int, model_id: str) -> HttpResponse:
    """A logged model of the run (a checkpoint) as a zip of its files, or ``?path=`` one."""
    model = get_object_or_404(LoggedModel, model_id=model_id, source_run_id=run_id, deleted=False)
    try:
        return _download(artifacts.model_root(model), request.GET.get("path", ""), model.name)
    except MlflowError as exc:
        raise Http404(exc.message) from None


@login_required_json
def run_distribution(request: HttpRequest, run_id: int) -> HttpResponse:
    """A distribution panel: ``?key=dist/<tag>`` over the run's steps."""
    run = get_object_or_404(Run, pk=run_id)
    query = parse(RunChartQuery, request)
    steps, vectors = q.series_of(q.series_for([run], [query.key])[run.pk], query.key)
    title = query.key.removeprefix("dist/")
    fig = distribution_bands(steps, vectors, f"{title} (distribution)")
    return chart_response(query, fig, running=run.is_active, filename=f"run-{run.pk}-dist")
