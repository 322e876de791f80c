"""The embedded default, one command (`make up`): SQLite + filesystem broker.

Migrates, prints a demo login, starts the web server, one CPU worker and the
reconciler (Celery beat), queues the quick stability study (trainer/studies/quick.json:
9 variants x 3 seeds) the first time, prints the
URL, and on Ctrl-C stops everything: the worker's shutdown makes a training
run checkpoint and go back to the queue, so the next `make up` resumes it.
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from experiments.models import Experiment
from experiments.services import create_experiment
from jobs import launch
from runs.management.commands.submit import study_definition_dict
from runs.services import create_study_sweep

STUDY = "quick"
STUDY_EXPERIMENT = "Stability study: quick"
STOP_GRACE_S = 60.0


class Command(BaseCommand):
    help = "Run the whole lab on this machine (web, CPU worker, reconciler); Ctrl-C stops it."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--steps", type=int, default=None, help="steps per study run (default: the study's)"
        )
        parser.add_argument("--no-study", action="store_true", help="queue nothing")

    def handle(self, *args, host, port, steps, no_study, **opts):
        var = Path(settings.VAR_DIR)
        var.mkdir(parents=True, exist_ok=True)
        call_command("migrate", verbosity=0, interactive=False)
        username, password = self._demo_user(var)
        if not no_study:
            self._queue_study(steps)

        procs: list[tuple[str, subprocess.Popen]] = []

        def start(name: str, cmd: list[str]) -> None:
            log = open(var / f"{name}.log", "ab")  # noqa: SIM115 - kept open for the child's life
            procs.append(
                (
                    name,
                    subprocess.Popen(
                        cmd, cwd=launch.ROOT, env=launch.process_env(), stdout=log,
                        stderr=subprocess.STDOUT, start_new_session=True,
                    ),
                )
            )  # fmt: skip

        start("web", launch.web_command(host, port))
        start("worker", launch.worker_command([settings.LAB_DEFAULT_QUEUE], "cpu@%h"))
        start("reconciler", launch.reconciler_command(var / "celerybeat-schedule"))

        url = f"http://{host}:{port}/"
        self._wait_for_web(url, procs)
        self.stdout.write(
            f"\nMoE-RL Stability Lab is up: {url}\n"
            f"  login: {username} / {password}\n"
            f"  logs:  {var}/web.log, worker.log, reconciler.log\n"
            "  Ctrl-C stops everything (a training run checkpoints and resumes next time).\n"
        )
        self.stdout.flush()

        stopping = {"flag": False}

        def on_signal(signum, frame):
            stopping["flag"] = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            while not stopping["flag"]:
                for name, proc in procs:
                    if proc.poll() is not None:
                        self.stderr.write(
                            f"{name} exited with {proc.returncode}; see {var}/{name}.log"
                        )
                        stopping["flag"] = True
                time.sleep(0.5)
        finally:
            self._stop(procs)
        self.stdout.write("stopped.")

    def _demo_user(self, var: Path) -> tuple[str, str]:
        """A demo superuser whose password is kept in var/ so it stays the same."""
        cred = var / "demo-login.txt"
        username = "demo"
        password = cred.read_text().strip() if cred.exists() else secrets.token_urlsafe(9)
        cred.write_text(password + "\n")
        cred.chmod(0o600)
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        return username, password

    def _queue_study(self, steps: int | None) -> None:
        if Experiment.objects.filter(name=STUDY_EXPERIMENT).exists():
            return
        owner = get_user_model().objects.get(username="demo")
        definition = study_definition_dict(STUDY)
        experiment = create_experiment(
            owner=owner,
            name=STUDY_EXPERIMENT,
            description=definition.get("description", ""),
            tags=["study", "demo"],
        )
        sweep = create_study_sweep(
            owner=owner,
            experiment=experiment,
            definition=definition,
            queue=settings.LAB_DEFAULT_QUEUE,
            overrides=[f"run.steps={steps}"] if steps else [],
        )
        self.stdout.write(
            f"queued '{STUDY_EXPERIMENT}': {sweep.runs.count()} runs "
            "(open Stability review on the experiment to compare the variants)"
        )

    def _wait_for_web(self, url: str, procs) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url + "accounts/login/", timeout=2).read()
                return
            except OSError:
                if procs[0][1].poll() is not None:
                    return
                time.sleep(0.3)

    def _stop(self, procs) -> None:
        """SIGTERM everyone (the worker stops its trainer gracefully), then wait."""
        for _, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for name, proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"{name} did not stop in time; killing it")
                proc.kill()
                proc.wait()
