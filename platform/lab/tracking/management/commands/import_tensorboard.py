"""``manage.py import_tensorboard FOLDER --experiment ID --user NAME [--follow]``: a run's
TensorBoard event files as an external lab run (lab/tracking/tensorboard.py).

Bad input exits 2 with a message naming the option; nothing is stored then.
"""

from __future__ import annotations

import time
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from lab.tracking import metric_map
from lab.tracking.errors import MlflowError
from lab.tracking.tensorboard import TensorBoardImport


class Command(BaseCommand):
    help = "Import a run's TensorBoard event files (and follow a folder still being written)."

    def add_arguments(self, parser):
        parser.add_argument(
            "folder", help="the folder holding the run's events.out.tfevents.* files"
        )
        parser.add_argument("--experiment", required=True, help="lab experiment id")
        parser.add_argument("--user", required=True, help="lab user the run belongs to")
        parser.add_argument("--name", default="", help="run name (default: the folder's name)")
        parser.add_argument(
            "--framework",
            default="",
            choices=["", *metric_map.FRAMEWORKS],
            help="whose metric names these are (default: told by the names)",
        )
        parser.add_argument("--run", type=int, default=None, help="read into this external run")
        parser.add_argument(
            "--steps-per-rollout",
            type=int,
            default=None,
            help="slime: train steps per rollout, to chart train metrics at their rollout "
            "(default: inferred from the two step axes)",
        )
        parser.add_argument("--follow", action="store_true", help="keep reading as files grow")
        parser.add_argument("--poll-s", type=float, default=5.0)
        parser.add_argument(
            "--idle-s", type=float, default=600.0, help="--follow: stop after this long quiet"
        )

    def handle(self, *args, **opts):
        folder = Path(opts["folder"]).expanduser()
        if opts["steps_per_rollout"] is not None and opts["steps_per_rollout"] < 1:
            raise CommandError("--steps-per-rollout: at least 1", returncode=2)
        if not folder.is_dir():
            raise CommandError(f"folder: {folder} is not a folder", returncode=2)
        user = get_user_model().objects.filter(username=opts["user"], is_active=True).first()
        if user is None:
            raise CommandError(f"--user: no active user {opts['user']!r}", returncode=2)
        try:
            if opts["run"] is not None:
                job = TensorBoardImport.resume(opts["run"], folder, opts["steps_per_rollout"])
            else:
                job = TensorBoardImport.start(
                    user=user,
                    experiment_id=opts["experiment"],
                    folder=folder,
                    run_name=opts["name"],
                    framework=opts["framework"],
                    steps_per_rollout=opts["steps_per_rollout"],
                )
        except MlflowError as exc:
            raise CommandError(exc.message, returncode=2) from None
        try:
            stored = job.poll(user)
            self.stdout.write(f"run {job.run.pk}: {stored} points")
            quiet_since = time.monotonic()
            while opts["follow"] and time.monotonic() - quiet_since < opts["idle_s"]:
                time.sleep(opts["poll_s"])
                new = job.poll(user)
                if new:
                    quiet_since = time.monotonic()
                    self.stdout.write(f"run {job.run.pk}: +{new} points")
        except KeyboardInterrupt:  # following stopped by hand: the run ends with what it has
            self.stdout.write(f"run {job.run.pk}: stopped following")
        except Exception as exc:  # never leave the run running: it fails with the reason
            job.finish(user, status="FAILED")
            message = (
                exc.message if isinstance(exc, MlflowError) else f"{type(exc).__name__}: {exc}"
            )
            raise CommandError(f"import failed, run {job.run.pk} failed: {message}") from None
        run = job.finish(user)
        for note in job.tracked.import_notes:
            self.stdout.write(f"not imported: {note['tag']} ({note['kind']}): {note['reason']}")
        self.stdout.write(f"run {run.pk}: {run.status}, {run.current_step} steps")
