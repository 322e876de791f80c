"""A database made by the layout before the ``lab`` package (apps imported as
bare ``runs``, ``jobs``, ...) migrates to the current layout without change.

The fixture ``fixtures/db_before_lab_package.sqlite3`` was created by that
layout's ``manage.py migrate`` plus one finished run with three metric rows,
sealed columns and a comment. App labels and table names are unchanged, so
the current code must re-apply nothing (only migrations written since, such as
a new field, run) and read the stored rows.
"""

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "db_before_lab_package.sqlite3"

pytestmark = pytest.mark.slow

READ_BACK = """
import django; django.setup()
from lab.runs.models import Run, MetricStep, Comment
run = Run.objects.get()
print(run.status, MetricStep.objects.filter(run=run).count(), Comment.objects.get().body)
"""


def _manage(args: list[str], var_dir: Path) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        "LAB_VAR_DIR": str(var_dir),
        "DJANGO_SETTINGS_MODULE": "lab.site.settings",
        "PYTHONPATH": f"{ROOT / 'platform'}:{ROOT}",
    }
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )


def _last(applied: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(app, number of its last applied migration), e.g. ("experiments", "0002")."""
    last: dict[str, str] = {}
    for app, name in applied:
        last[app] = max(last.get(app, ""), name[:4])
    return list(last.items())


def test_database_from_previous_layout_migrates_cleanly(tmp_path):
    shutil.copy(FIXTURE, tmp_path / "db.sqlite3")
    before = (
        sqlite3.connect(tmp_path / "db.sqlite3")
        .execute("select app, name from django_migrations order by id")
        .fetchall()
    )

    plan = _manage(["manage.py", "migrate", "--plan"], tmp_path).stdout
    _manage(["manage.py", "migrate", "--no-input"], tmp_path)
    after = (
        sqlite3.connect(tmp_path / "db.sqlite3")
        .execute("select app, name from django_migrations order by id")
        .fetchall()
    )
    project_apps = {"experiments", "runs", "jobs", "dashboard"}
    # Every project migration the old layout applied is still recognised by its
    # label; nothing of the project's is re-applied or renamed.
    assert [m for m in before if m[0] in project_apps] == [
        m for m in after[: len(before)] if m[0] in project_apps
    ]
    # The plan holds only migrations written after the fixture (new fields), never
    # one the old layout already applied under another module path.
    planned = [
        tuple(line.strip().split(" ")[0].split(".", 1))
        for line in plan.splitlines()
        if line.split(".")[0].strip() in project_apps
    ]
    assert not set(planned) & set(before)
    assert all(name[:4] > last for app, name in planned for a, last in _last(before) if a == app)

    # The stored rows are read by the new layout's models.
    out = _manage(["-c", READ_BACK], tmp_path).stdout.split()
    assert out[:2] == ["succeeded", "3"]
    assert " ".join(out[2:]) == "kept across the layout change"
