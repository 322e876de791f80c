"""The web process imports the review's statistics in the background after its
first request (dashboard/web/warmup.py), once, and not where it is switched off."""

import threading

from django.core.signals import request_started

from dashboard.web import warmup


def _reset(monkeypatch, value: str) -> list[str]:
    imported: list[str] = []
    monkeypatch.setenv("LAB_WARM_IMPORTS", value)
    monkeypatch.setattr(warmup, "_started", threading.Event())
    monkeypatch.setattr(warmup.importlib, "import_module", imported.append)
    warmup.connect()
    return imported


def test_the_first_request_starts_the_imports_once(monkeypatch):
    imported = _reset(monkeypatch, "1")
    request_started.send(sender=None)
    for thread in threading.enumerate():
        if thread.name == "review-warmup":
            thread.join()
    assert imported == list(warmup.MODULES)
    request_started.send(sender=None)  # disconnected: nothing more
    assert imported == list(warmup.MODULES)


def test_switched_off_it_imports_nothing(monkeypatch):
    imported = _reset(monkeypatch, "0")
    request_started.send(sender=None)
    assert imported == [] and warmup._started.is_set()
