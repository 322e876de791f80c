"""`make up`'s preparation steps, without starting processes: the demo login
survives restarts, the worker slots follow the machine's cores."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from lab.jobs.management.commands.lab_up import Command


def test_restart_keeps_the_demo_password_and_every_session(db, tmp_path):
    first_user, first_password = Command()._demo_user(tmp_path)
    user = get_user_model().objects.get(username=first_user)
    session_hash = user.get_session_auth_hash()

    _, again = Command()._demo_user(tmp_path)

    user.refresh_from_db()
    assert again == first_password
    assert user.check_password(first_password) and user.is_superuser
    # The session auth hash derives from the password hash (salt included): unchanged,
    # so a browser logged in before the restart stays logged in.
    assert user.get_session_auth_hash() == session_hash


def test_a_lost_credentials_file_gets_a_new_password(db, tmp_path):
    _, first = Command()._demo_user(tmp_path)
    (tmp_path / "demo-login.txt").unlink()
    _, second = Command()._demo_user(tmp_path)
    assert second != first
    assert get_user_model().objects.get(username="demo").check_password(second)
    assert (tmp_path / "demo-login.txt").read_text().strip() == second


def test_the_demo_is_a_slice_of_the_causal_study_on_one_thread_per_run(db, tmp_path):
    from lab.runs.demo import DEMO_EXPERIMENT, DEMO_PRIORITY, DEMO_SEEDS, DEMO_VARIANTS
    from lab.runs.models import Run
    from trainer.studies.definition import load_definition

    Command()._demo_user(tmp_path)
    Command()._queue_study(steps=None)
    runs = Run.objects.filter(experiment__name=DEMO_EXPERIMENT).order_by("created_at", "id")
    assert runs.count() == len(DEMO_VARIANTS) * len(DEMO_SEEDS)
    assert set(runs.values_list("variant", flat=True)) == set(DEMO_VARIANTS)
    # Seed-major: the first runs to start (and finish) cover every cell.
    first = [r.variant for r in runs[: len(DEMO_VARIANTS)]]
    assert sorted(first) == sorted(DEMO_VARIANTS)
    assert {r.config["run"]["threads"] for r in runs} == {1}
    # Each demo run is the causal study's own run (same config but the thread count).
    dose = load_definition("causal")
    variant = next(v for v in dose.variants if v.name == runs[0].variant)
    expected = dose.config_for(variant, runs[0].config["run"]["seed"], ["run.threads=1"])
    assert runs[0].config == expected.to_dict()
    assert {r.total_steps for r in runs} == {150}
    assert {r.priority for r in runs} == {DEMO_PRIORITY} == {0}  # the background of the queue
    Command()._queue_study(steps=None)  # the next `make up` queues nothing more
    assert Run.objects.count() == len(DEMO_VARIANTS) * len(DEMO_SEEDS)


def test_one_worker_slot_per_usable_core():
    import os

    from lab.jobs.management.commands.lab_up import worker_slots

    assert worker_slots() == len(os.sched_getaffinity(0))
