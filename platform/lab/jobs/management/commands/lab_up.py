"""The embedded default, one command (`make up`): SQLite + filesystem broker.

Migrates, prints a demo login, starts the web server, one CPU worker slot per
core (each trains with one thread) and the reconciler (Celery beat), queues the
demo (lab/runs/demo.py: a slice of the causal study at the lowest priority)
the first time, prints the URL, and on Ctrl-C stops everything: the worker's
shutdown makes a training run checkpoint and go back to the queue, so the next
`make up` resumes it.

``--check`` (``make up UP_ARGS=--check``, what CI runs before ``make test``)
does the same, waits until every worker slot is live and a demo run trains,
then stops everything and checks that no run was left running or spent
(lab/jobs/up_check.py); the exit status says whether it held.

Why this runner and not a Procfile run by honcho: on Ctrl-C honcho sends
SIGTERM to every process, then SIGKILL to whatever still runs 5 s after the
first one exits (honcho 2.0 ``manager.KILL_WAIT``, a constant with no
option). The web server exits at once, so the worker would be killed 5 s
later, in the middle of stopping its trainer: the run would neither
checkpoint nor go back to the queue (it would wait for the reconciler and
spend an attempt). ``_stop`` below waits up to ``STOP_GRACE_S`` instead.
honcho also has no "run this first" step (migrate, demo user, queue the
study) nor a "ready" hook to print the URL once the server answers.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from lab.assets.roots import ROOTS_SETTING, default_asset_roots
from lab.jobs import launch, up_check
from lab.runs.demo import DEMO_EXPERIMENT, DEMO_USER, queue_demo

STOP_GRACE_S = 60.0


def _last_lines(log: Path, count: int = 3) -> str:
    """Why a process stopped: its log's last CRITICAL or ERROR line, else its last lines."""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    alarms = [line for line in lines if "CRITICAL/" in line or "ERROR/" in line]
    return "".join(f"\n  {line}" for line in (alarms[-1:] or lines[-count:]))


def worker_slots() -> int:
    """One CPU worker per core the process may use: each run trains on one thread."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class Command(BaseCommand):
    help = "Run the whole lab on this machine (web, CPU workers, reconciler); Ctrl-C stops it."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--steps", type=int, default=None, help="steps per study run (default: the study's)"
        )
        parser.add_argument("--no-study", action="store_true", help="queue nothing")
        parser.add_argument(
            "--workers", type=int, default=None, help="CPU worker slots (default: one per core)"
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="start, wait until every worker slot is live and a demo run trains, stop, "
            "and exit 1 unless every run went back to the queue unspent (CI)",
        )

    def handle(self, *args, host, port, steps, no_study, workers, check, **opts):
        var = Path(settings.VAR_DIR)
        var.mkdir(parents=True, exist_ok=True)
        roots = self._asset_roots(var)
        call_command("migrate", verbosity=0, interactive=False)
        username, password = self._demo_user(var)
        if not no_study:
            self._queue_study(steps)

        slots = max(1, workers or worker_slots())
        procs = self._start_processes(var, host, port, slots)
        url = f"http://{host}:{port}/"
        self._wait_for_web(url, procs)
        self.stdout.write(
            f"\nMoE-RL Stability Lab is up: {url}\n"
            f"  login: {username} / {password}\n"
            f"  workers: {slots} CPU slot{'s' if slots != 1 else ''}, one thread each\n"
            f"  models and data may be read from: {roots} (LAB_ASSET_ROOTS)\n"
            f"  logs:  {var}/web.log, worker*.log, reconciler.log\n"
            "  Ctrl-C stops everything (a training run checkpoints and resumes next time).\n"
        )
        self.stdout.flush()

        if check:
            self._check(procs, var, slots, url)
            return
        self._run_until_stopped(procs, var)
        self.stdout.write("stopped.")

    def _check(self, procs, var: Path, slots: int, url: str) -> None:
        """Wait until the lab works, stop it as Ctrl-C would, and judge the stop."""
        try:
            started = up_check.wait_until_working(procs, slots, var, url)
        finally:
            self._stop(procs)
        problems = started.problems + up_check.problems_after_stop(procs, started)
        for line in started.notes:
            self.stdout.write(f"  {line}")
        if problems:
            raise CommandError("make up check failed:\n  " + "\n  ".join(problems))
        self.stdout.write(
            "check passed: started, trained, stopped; every run is back in the queue."
        )

    @staticmethod
    def _asset_roots(var: Path) -> str:
        """LAB_ASSET_ROOTS for every process started here: the deployment's own
        when set, else the lab's shipped data and var/ (put checkpoints and data
        files there, or set the variable), so no path is read from anywhere."""
        if not os.environ.get(ROOTS_SETTING):
            os.environ[ROOTS_SETTING] = os.pathsep.join(str(p) for p in default_asset_roots(var))
            settings.LAB_ASSET_ROOTS = [Path(p) for p in os.environ[ROOTS_SETTING].split(":")]
        return os.environ[ROOTS_SETTING]

    def _start_processes(
        self, var: Path, host: str, port: int, slots: int
    ) -> list[tuple[str, subprocess.Popen]]:
        """Web server, ``slots`` CPU workers and the reconciler, each logging to var/<name>.log."""
        procs: list[tuple[str, subprocess.Popen]] = []

        def start(name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
            log = open(var / f"{name}.log", "ab")  # noqa: SIM115 - kept open for the child's life
            procs.append(
                (
                    name,
                    subprocess.Popen(
                        cmd,
                        cwd=launch.ROOT,
                        env=launch.process_env(env),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    ),
                )
            )

        start("web", launch.web_command(host, port))
        # One thread per slot: slots x threads = cores, so the runs do not fight over
        # cores (a run's own run.threads, when set, still wins inside its trainer).
        one_thread = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        for i in range(slots):
            name = "worker" if i == 0 else f"worker{i}"
            start(
                name, launch.worker_command([settings.LAB_DEFAULT_QUEUE], f"cpu{i}@%h"), one_thread
            )
        start("reconciler", launch.reconciler_command(var / "celerybeat-schedule"))
        return procs

    def _run_until_stopped(self, procs: list[tuple[str, subprocess.Popen]], var: Path) -> None:
        """Wait for Ctrl-C, SIGTERM or any process exiting; then stop them all."""
        stopping = {"flag": False}

        def on_signal(signum, frame):
            stopping["flag"] = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        lost = None
        try:
            while not stopping["flag"]:
                for name, proc in procs:
                    if proc.poll() is not None:
                        lost = f"{name} exited with {proc.returncode}; see {var}/{name}.log"
                        self.stderr.write(lost + _last_lines(var / f"{name}.log"))
                        stopping["flag"] = True
                time.sleep(0.5)
        finally:
            self._stop(procs)
        if lost is not None:  # a part died (the reconciler's scheduler, a worker): say so
            raise CommandError(f"stopped everything: {lost}", returncode=1)

    def _demo_user(self, var: Path) -> tuple[str, str]:
        """A demo superuser whose password is set once and kept in var/.

        The password is set only when the user is new or the credentials file
        is missing: ``set_password`` draws a new salt, which changes the
        session auth hash and would log every browser out on each restart.
        """
        cred = var / "demo-login.txt"
        username = DEMO_USER
        user, created = get_user_model().objects.get_or_create(username=username)
        if cred.exists() and not created:
            password = cred.read_text().strip()
        else:
            password = secrets.token_urlsafe(9)
            user.set_password(password)
            cred.write_text(password + "\n")
            cred.chmod(0o600)
        user.is_staff = user.is_superuser = True
        user.save()
        return username, password

    def _queue_study(self, steps: int | None) -> None:
        owner = get_user_model().objects.get(username=DEMO_USER)
        sweep = queue_demo(owner, queue=settings.LAB_DEFAULT_QUEUE, steps=steps)
        if sweep is not None:
            self.stdout.write(
                f"queued '{DEMO_EXPERIMENT}': {sweep.runs.count()} runs at the lowest "
                "priority (your own runs start first; open Stability review on the "
                "experiment to compare the variants)"
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
