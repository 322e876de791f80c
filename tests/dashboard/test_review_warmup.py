"""The web process imports the review's statistics in the background after its
first request (dashboard/web/warmup.py), once, and not where it is switched off."""

import threading

from dashboard.web import warmup


def _reset(monkeypatch, value: str) -> list[str]:
    imported: list[str] = []
    monkeypatch.setenv("LAB_WARM_IMPORTS", value)
    monkeypatch.setattr(warmup, "_started", threading.Event())
    monkeypatch.setattr(warmup.importlib, "import_module", imported.append)
    return imported


def test_the_first_request_starts_the_imports_once(monkeypatch):
    imported = _reset(monkeypatch, "1")
    warmup.on_first_request()
    for thread in threading.enumerate():
        if thread.name == "review-warmup":
            thread.join()
    assert imported == list(warmup.MODULES)
    warmup.on_first_request()  # once only
    assert imported == list(warmup.MODULES)


def test_switched_off_it_imports_nothing(monkeypatch):
    imported = _reset(monkeypatch, "0")
    warmup.on_first_request()
    assert imported == [] and warmup._started.is_set()


def test_the_web_app_listens_for_the_first_request(monkeypatch):
    from django.core.signals import request_started

    monkeypatch.setattr(warmup, "_started", threading.Event())
    warmup.connect()  # what WebConfig.ready does
    listening = request_started._live_receivers(None)
    listening = listening[0] if isinstance(listening, tuple) else listening  # sync, async
    assert warmup.on_first_request in listening
    request_started.disconnect(warmup.on_first_request)
