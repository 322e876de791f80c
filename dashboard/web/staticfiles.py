"""Serve plotly.js from the installed Python plotly package, never from a CDN.

``PlotlyJsFinder`` is a staticfiles finder that exposes the ``plotly.min.js``
shipped inside the plotly wheel (``plotly/package_data/plotly.min.js``) as the
static file ``dashboard/plotly.min.js``. Nothing is copied into the repository,
``runserver`` and whitenoise find it like any app static file,
``collectstatic`` copies it, and its version always matches the figures'
Python plotly. Enable it in settings:

    STATICFILES_FINDERS = [
        "django.contrib.staticfiles.finders.FileSystemFinder",
        "django.contrib.staticfiles.finders.AppDirectoriesFinder",
        "dashboard.web.staticfiles.PlotlyJsFinder",
    ]
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import plotly
from django.contrib.staticfiles import utils
from django.contrib.staticfiles.finders import BaseFinder, searched_locations
from django.core.checks import Error
from django.core.files.storage import FileSystemStorage

STATIC_PATH = "dashboard/plotly.min.js"
PREFIX, FILENAME = STATIC_PATH.rsplit("/", 1)


def plotly_js_path() -> Path:
    """The plotly.min.js bundled with the installed plotly package."""
    return Path(plotly.__file__).resolve().parent / "package_data" / FILENAME


class PlotlyJsFinder(BaseFinder):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.source = plotly_js_path()
        self.storage = FileSystemStorage(location=str(self.source.parent))
        self.storage.prefix = PREFIX  # collectstatic writes it under dashboard/

    def check(self, **kwargs) -> list[Error]:
        if not self.source.is_file():
            return [
                Error(
                    f"plotly.js not found at {self.source}",
                    hint="Reinstall the plotly package; dashboards need its bundled plotly.min.js.",
                    id="dashboard.E001",
                )
            ]
        return []

    # RemovedInDjango61Warning: ``**kwargs`` still accepts the deprecated ``all``.
    def find(self, path: str, find_all: bool = False, **kwargs) -> str | list[str] | None:
        if kwargs:
            find_all = self._check_deprecated_find_param(find_all=find_all, **kwargs)
        found = str(self.source) if path == STATIC_PATH and self.source.is_file() else None
        if str(self.source.parent) not in searched_locations:
            searched_locations.append(str(self.source.parent))
        if find_all:
            return [found] if found else []
        return found

    def list(self, ignore_patterns: list[str] | None) -> Iterator[tuple[str, FileSystemStorage]]:
        if self.source.is_file() and not utils.matches_patterns(FILENAME, ignore_patterns or []):
            yield FILENAME, self.storage
