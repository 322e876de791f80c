"""A minimal MLflow REST caller for in-process tests (Django's test client, a lab API
token): the request shapes of MLflow's service.proto as JSON. A plain module on the
test path (pyproject's pythonpath lists ``tests``)."""

from __future__ import annotations

import json

from django.test import Client
from rest_framework.authtoken.models import Token

API = "/api/2.0/mlflow"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"


class Mlflow:
    """A minimal MLflow REST caller with a lab token."""

    def __init__(self, user):
        self.client = Client()
        self.auth = f"Bearer {Token.objects.get_or_create(user=user)[0].key}"

    def call(self, method: str, route: str, body=None, *, auth: str | None = "default"):
        headers = (
            {} if auth is None else {"HTTP_AUTHORIZATION": self.auth if auth == "default" else auth}
        )
        if method == "GET":
            resp = self.client.get(f"{API}/{route}", body or {}, **headers)
        else:
            raw = body if isinstance(body, str | bytes) else json.dumps(body or {})
            resp = self.client.generic(
                method, f"{API}/{route}", raw, content_type="application/json", **headers
            )
        return resp.status_code, resp.json()

    def artifact(self, method: str, artifact_path: str, data: bytes = b"", **query):
        """A call of MLflow's artifact API (``/api/2.0/mlflow-artifacts/artifacts/...``):
        (status, the response)."""
        url = f"{ARTIFACTS}/{artifact_path}" if artifact_path else ARTIFACTS
        headers = {"HTTP_AUTHORIZATION": self.auth}
        if method == "GET":
            resp = self.client.get(url, query, **headers)
        else:
            resp = self.client.generic(
                method, url, data, content_type="application/octet-stream", **headers
            )
        return resp.status_code, resp

    def ok(self, method: str, route: str, body=None):
        code, data = self.call(method, route, body)
        assert code == 200, (code, data)
        return data

    def run(self, experiment_id: str, name: str = "r", tags=None) -> str:
        data = self.ok("POST", "runs/create", {
            "experiment_id": experiment_id, "run_name": name, "start_time": 1,
            "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()],
        })  # fmt: skip
        return data["run"]["info"]["run_id"]
