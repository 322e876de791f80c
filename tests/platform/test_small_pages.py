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
