"""A database made before dashboard/ had rooms migrates without change.

Team review's models moved from ``dashboard/models.py`` to
``dashboard/review/models.py`` and keep the app label ``dashboard``: their
tables (``dashboard_verdict``, ...), their content types and the migration
history stay those of the database. The fixture
``fixtures/db_before_dashboard_rooms.sql`` is the SQLite dump (``iterdump``) of
that layout's ``manage.py migrate`` plus one run with a verdict, a saved
comparison with a comment and a pinned baseline.
"""

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "db_before_dashboard_rooms.sql"

pytestmark = pytest.mark.slow

READ_BACK = """
import django; django.setup()
from django.contrib.contenttypes.models import ContentType
from dashboard.review.models import BaselinePin, ComparisonComment, SavedComparison, Verdict
verdict = Verdict.objects.get()
comparison = SavedComparison.objects.get()
print(verdict.label, verdict.note.replace(" ", "_"), comparison.run_ids == [verdict.run_id],
      ComparisonComment.objects.get().comparison_id == comparison.pk,
      BaselinePin.objects.get().run_id == verdict.run_id,
      ContentType.objects.get_for_model(Verdict).app_label)
Verdict.objects.create(run_id=verdict.run_id, label="collapsed", author_id=verdict.author_id)
print(Verdict.objects.count())
"""


def _manage(args: list[str], var_dir: Path) -> str:
    env = {
        "PATH": "/usr/bin:/bin",
        "LAB_VAR_DIR": str(var_dir),
        "DJANGO_SETTINGS_MODULE": "lab.site.settings",
        "PYTHONPATH": f"{ROOT / 'platform'}:{ROOT}",
    }
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _applied(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("select app, name from django_migrations order by id").fetchall()


def test_a_database_from_before_the_rooms_migrates_and_reads_back(tmp_path):
    db = tmp_path / "db.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.executescript(FIXTURE.read_text())
    before = _applied(db)
    assert ("dashboard", "0001_initial") in before

    plan = _manage(["manage.py", "migrate", "--plan"], tmp_path)
    # Nothing of the review's is applied again under a new module path.
    assert not [line for line in plan.splitlines() if line.strip().startswith("dashboard.")]
    _manage(["manage.py", "migrate", "--no-input"], tmp_path)
    assert _applied(db)[: len(before)] == before
    # The models' state matches the migrations (no migration is missing for the move).
    _manage(["manage.py", "makemigrations", "--check", "--dry-run", "dashboard"], tmp_path)

    kept, count = _manage(["-c", READ_BACK], tmp_path).strip().splitlines()
    assert kept.split() == ["stable", "kept_across_the_rooms_move", "True", "True", "True",
                            "dashboard"]  # fmt: skip
    assert count == "2"
