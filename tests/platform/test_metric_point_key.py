"""MetricPoint keyed by MLflow's primary key (tracking migration 0004): the points a
database held under the surrogate id survive the migration both ways, and the key
still deduplicates a retried point while keeping two points at one step."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from mlflow_rest import Mlflow

from lab.runs.models import Run
from lab.tracking.models import MetricPoint
from lab.tracking.payload import Point
from lab.tracking.points import keep_as_logged

pytestmark = pytest.mark.database

BEFORE = [("tracking", "0003_tensorboard_import_job")]
AFTER = [("tracking", "0004_metric_point_natural_key")]
TABLE = "tracking_metricpoint"
ROWS = [  # key, step, timestamp, value, nonfinite: two at one step, a NaN
    ("loss", 0, 1000, 1.5, 0),
    ("loss", 0, 1001, 1.25, 0),
    ("loss", 1, 2000, 0.0, 1),
    ("reward/mean@1", 1, 2000, 0.5, 0),
]


def _migrate(target) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target)


def _points(run_id: int) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT "key", "step", "timestamp", "value", "nonfinite" FROM "{TABLE}" '
            'WHERE "run_id" = %s ORDER BY "key", "timestamp"',
            [run_id],
        )
        return [tuple(row) for row in cursor.fetchall()]


def _external_run(user) -> Run:
    ml = Mlflow(user)
    experiment = ml.ok("POST", "experiments/create", {"name": "ext"})["experiment_id"]
    return Run.all_objects.get(pk=int(ml.run(experiment, "seed-0")))


def _table_sql() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT sql FROM sqlite_master WHERE name = %s", [TABLE])
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_points_survive_the_key_migration_both_ways(user):
    run = _external_run(user)
    try:
        _migrate(BEFORE)
        with connection.cursor() as cursor:
            cursor.executemany(
                f'INSERT INTO "{TABLE}" ("run_id", "key", "step", "timestamp", "value", '
                '"nonfinite") VALUES (%s, %s, %s, %s, %s, %s)',
                [(run.pk, *row) for row in ROWS],
            )
        _migrate(AFTER)
        assert _points(run.pk) == sorted(ROWS)
        if connection.vendor == "sqlite":
            assert _table_sql().endswith("WITHOUT ROWID") and '"id" integer' not in _table_sql()
        _migrate(BEFORE)  # and back: every row again, under a fresh id
        assert _points(run.pk) == sorted(ROWS)
    finally:
        _migrate(AFTER)
    assert _points(run.pk) == sorted(ROWS)


@pytest.mark.django_db
def test_the_key_dedupes_a_retried_point_and_keeps_two_at_one_step(user):
    run = _external_run(user)
    batch = [Point("loss", 1.5, 1000, 0), Point("loss", 1.25, 1001, 0), Point("x", None, 5, 0, 1)]
    keep_as_logged(run.pk, batch)
    keep_as_logged(run.pk, batch)  # the client retried the whole batch
    stored = MetricPoint.objects.filter(run=run).order_by("key", "timestamp")
    assert [(p.key, p.step, p.timestamp, p.value, p.nonfinite) for p in stored] == [
        ("loss", 0, 1000, 1.5, 0),
        ("loss", 0, 1001, 1.25, 0),
        ("x", 0, 5, 0.0, 1),
    ]
    run.delete()  # the points go with their run
    assert not MetricPoint.objects.filter(run_id=run.pk).exists()
