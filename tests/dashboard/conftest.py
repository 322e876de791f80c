"""Fixtures for the dashboard view tests: users, an experiment, runs with stored metrics.

Runs are created through the platform's services (submit_run, ingest_metrics);
only the fields a worker would set at the end (status, summary, steps) are
written directly, as the worker's own services would leave them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from django.test import Client
from teams import share

from lab.experiments.services import create_experiment
from lab.runs import lifecycle
from lab.runs.metrics.ingest import ingest_metrics
from lab.runs.metrics.seal import seal_metrics
from lab.runs.models import Run, RunStatus


@pytest.fixture
def client_for() -> Callable[[Any], Client]:
    def make(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return make


@pytest.fixture
def alice(client_for, user) -> Client:
    return client_for(user)


@pytest.fixture
def experiment(user):
    return create_experiment(owner=user, name="replay vs none", preset="moe-grpo", tags=["r3"])


@pytest.fixture
def make_run(user, experiment) -> Callable[..., Run]:
    """A run of ``experiment`` with these metric records stored and this final state."""

    def make(
        *,
        variant: str = "none",
        seed: int = 0,
        records: Sequence[dict[str, Any]] = (),
        status: str = RunStatus.SUCCEEDED,
        summary: dict[str, Any] | None = None,
        owner=None,
        preset: str = "moe-grpo",
        overrides: dict[str, Any] | None = None,
        experiment_=None,
        queue: str | None = None,
    ) -> Run:
        if owner is not None and owner != (experiment_ or experiment).owner:
            share(experiment_ or experiment, owner)  # a teammate's run
        run = lifecycle.submit_run(
            owner=owner or user,
            experiment=experiment_ or experiment,
            preset=preset,
            overrides={"run.seed": seed, "run.steps": 100, **(overrides or {})},
            variant=variant,
            queue=queue,
        )
        if records:
            ingest_metrics(run.pk, records)
        # current_step counts the steps stored (the worker's steps_done): last step + 1
        done = max((r["step"] + 1 for r in records), default=0)
        Run.objects.filter(pk=run.pk).update(status=status, summary=summary, current_step=done)
        seal_metrics(run.pk)  # as a worker's finish does (a no-op unless final)
        run.refresh_from_db()
        return run

    return make


def records(steps: int, **series: Callable[[int], Any]) -> list[dict[str, Any]]:
    """[{"step": s, key: f(s), ...}] for s in 0..steps-1; keys use '__' for '/'."""
    return [
        {"step": s, **{k.replace("__", "/"): f(s) for k, f in series.items()}} for s in range(steps)
    ]


def plotly_array(value: Any):
    """A trace array from a live payload: a plain list, or plotly's typed array
    ``{"dtype", "bdata"[, "shape"]}`` (base64), as a numpy array."""
    import base64

    import numpy as np

    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        if "shape" in value:
            shape = value["shape"]
            shape = [int(n) for n in shape.split(",")] if isinstance(shape, str) else shape
            arr = arr.reshape(shape)
        return arr
    return np.asarray([np.nan if v is None else v for v in value], dtype=float)


def payload_traces(response) -> list[dict[str, Any]]:
    """The traces of a chart endpoint's live payload with x, y (and z) decoded."""
    body = response.json()
    traces = []
    for trace in body["figure"]["data"]:
        decoded = dict(trace)
        for axis in ("x", "y", "z"):
            if axis in trace and not (axis == "y" and trace.get("type") == "heatmap"):
                decoded[axis] = plotly_array(trace[axis])
        traces.append(decoded)
    return traces
