"""Small things a newcomer meets: a favicon, browsable API docs served locally."""

from __future__ import annotations

import re

import pytest
from django.contrib.staticfiles import finders
from django.test import Client


@pytest.fixture
def browser(user):
    client = Client()
    client.login(username="alice", password="pw-alice")
    return client


def test_every_page_names_a_favicon_that_exists(browser):
    page = browser.get("/experiments/").content.decode()
    href = re.search(r'<link rel="icon" href="([^"]+)"', page).group(1)
    assert href == "/static/dashboard/favicon.svg"
    assert finders.find("dashboard/favicon.svg")
    response = Client().get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == href


def test_api_docs_are_browsable_from_local_static_files(browser):
    for url in ("/api/docs/",):
        response = browser.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert "/api/openapi" in html
        assert "cdn" not in html.lower() and "https://" not in html
        scripts = re.findall(r'<script src="([^"]+)"', html)
        assert scripts and all(s.startswith("/static/drf_spectacular_sidecar/") for s in scripts)
        assert all(finders.find(s.removeprefix("/static/")) for s in scripts)


def test_api_docs_need_login(db):
    response = Client().get("/api/docs/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def test_openapi_opens_in_a_browser_instead_of_downloading(browser):
    """A browser gets the YAML as text it shows; clients keep their media types."""
    shown = browser.get("/api/openapi", HTTP_ACCEPT=BROWSER_ACCEPT)
    assert shown.status_code == 200
    assert shown["Content-Type"] == "text/plain; charset=utf-8"
    assert shown.content.decode().startswith("openapi:")
    assert "attachment" not in shown.get("Content-Disposition", "")
    yaml = browser.get("/api/openapi", HTTP_ACCEPT="application/vnd.oai.openapi")
    assert yaml["Content-Type"].startswith("application/vnd.oai.openapi")
    as_json = browser.get("/api/openapi", {"format": "json"}, HTTP_ACCEPT=BROWSER_ACCEPT)
    assert as_json["Content-Type"].startswith("application/vnd.oai.openapi+json")
