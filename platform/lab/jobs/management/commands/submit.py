"""Queue a run (config file or preset + --set) or a sweep definition from a terminal.

    python manage.py submit --preset moe-grpo --set run.steps=30 --queue cpu
    python manage.py submit --config cfg.json --experiment 3 --queue gpu-a100
    python manage.py submit --sweep sweep.json      # {"preset"|"base_config", "grid", "seeds"}
    python manage.py submit --study quick           # a stability study: built-in name or STUDY.json

A bad config prints the offending field paths and exits with code 2; nothing is stored.
A study goes only to a queue some live worker serves (``--force`` queues it anyway:
the runs wait for a worker); submitting the same study again makes a new
experiment, or with ``--experiment`` says that it adds seeds to that one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from lab.configs import resolve_config
from lab.experiments.models import Experiment
from lab.experiments.rights import NotAllowed
from lab.experiments.services import create_experiment
from lab.jobs.queries import unserved_warning
from lab.runs import lifecycle, sweeps
from lab.runs.lifecycle import check_queue
from lab.runs.models import Run
from trainer.errors import BAD_INPUT_EXIT_CODE, FieldError
from trainer.studies.definition import BUILTIN_STUDIES, builtin_dict


class Command(BaseCommand):
    help = "Queue a run or a sweep; prints the ids."

    def add_arguments(self, parser):
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--config", help="JSON config file")
        source.add_argument("--preset", help="named preset (python -m trainer presets)")
        source.add_argument("--sweep", help="JSON sweep: preset|base_config, grid, seeds")
        source.add_argument("--study", help="stability study: quick | full | STUDY.json")
        parser.add_argument("--set", dest="overrides", action="append", default=[])
        parser.add_argument("--queue", default=None)
        parser.add_argument("--priority", type=int, default=None)
        parser.add_argument("--variant", default="")
        parser.add_argument("--experiment", help="experiment id or name (created if new)")
        parser.add_argument("--user", default=None, help="owner (default: first superuser)")
        parser.add_argument(
            "--force",
            action="store_true",
            help="queue a study even when no live worker serves its queue",
        )

    def handle(self, *args, **opts):
        try:
            owner = self._owner(opts["user"])
            if opts["sweep"]:
                self._sweep(owner, opts)
            elif opts["study"]:
                self._study(owner, opts)
            else:
                self._run(owner, opts)
        except FieldError as exc:
            self.stderr.write("invalid input:")
            for path, msg in exc.errors:
                self.stderr.write(f"  {path or '(root)'}: {msg}")
            sys.exit(BAD_INPUT_EXIT_CODE)
        except NotAllowed as exc:
            raise CommandError(str(exc)) from None

    def _owner(self, username):
        users = get_user_model().objects
        if username:
            try:
                return users.get(username=username)
            except users.model.DoesNotExist:
                raise CommandError(f"no user '{username}'") from None
        owner = users.filter(is_superuser=True).order_by("pk").first()
        if owner is None:
            raise CommandError("no superuser: pass --user or run `manage.py lab_user`")
        return owner

    def _experiment(self, owner, ref: str | None, default_name: str) -> Experiment:
        if ref and ref.isascii() and ref.isdigit():  # "²".isdigit() is True
            try:
                return Experiment.objects.get(pk=int(ref))
            except Experiment.DoesNotExist:
                raise CommandError(f"no experiment {ref}") from None
        name = ref or default_name
        found = Experiment.objects.filter(name=name).order_by("pk").first()
        return found or create_experiment(owner=owner, name=name)

    def _run(self, owner, opts):
        config = _read_json(opts["config"], "--config") if opts["config"] else None
        # Validate before touching the database: a bad config stores nothing.
        resolve_config(config, opts["preset"], opts["overrides"])
        experiment = self._experiment(owner, opts["experiment"], "terminal submissions")
        run = lifecycle.submit_run(
            owner=owner,
            experiment=experiment,
            config=config,
            preset=opts["preset"],
            overrides=opts["overrides"],
            queue=opts["queue"],
            priority=opts["priority"],
            variant=opts["variant"],
        )
        self.stdout.write(f"run {run.pk} queued on '{run.queue}' (experiment {experiment.pk})")

    def _sweep(self, owner, opts):
        spec = _read_json(opts["sweep"], "--sweep")
        unknown = set(spec) - {"name", "preset", "base_config", "grid", "seeds", "queue"}
        if unknown:
            raise FieldError([(k, "unknown field") for k in sorted(unknown)])
        base = resolve_config(spec.get("base_config"), spec.get("preset"), opts["overrides"])
        sweeps.preview_sweep(base.to_dict(), spec.get("grid", {}), spec.get("seeds", [0]))
        experiment = self._experiment(owner, opts["experiment"], spec.get("name") or "sweeps")
        sweep = sweeps.create_sweep(
            owner=owner,
            experiment=experiment,
            base_config=base.to_dict(),
            grid=spec.get("grid", {}),
            seeds=spec.get("seeds", [0]),
            queue=opts["queue"] or spec.get("queue"),
            name=spec.get("name", ""),
            priority=opts["priority"],
        )
        ids = list(sweep.runs.values_list("pk", flat=True))
        self.stdout.write(f"sweep {sweep.pk}: {len(ids)} runs queued: {ids}")

    def _study(self, owner, opts):
        definition = study_definition_dict(opts["study"])
        queue = check_queue(opts["queue"])
        warning = unserved_warning(queue)
        default_name = f"Stability study: {definition.get('name', 'study')}"
        # One transaction: a bad study (exit 2) or an unserved queue stores nothing,
        # and the runs' wake-ups are published only on commit.
        with transaction.atomic():
            experiment = self._study_experiment(owner, opts["experiment"], default_name)
            earlier = Run.objects.filter(experiment=experiment, sweep__study__isnull=False).count()
            sweep = sweeps.create_study_sweep(
                owner=owner,
                experiment=experiment,
                definition=definition,
                queue=queue,
                overrides=opts["overrides"],
                priority=opts["priority"],
            )
            if warning and not opts["force"]:
                raise CommandError(
                    f"{warning} Start a worker for it (docs/platform.md) or pass --force "
                    "to queue the study anyway."
                )
        ids = list(sweep.runs.values_list("pk", flat=True))
        if warning:
            self.stderr.write(f"warning: {warning}")
        self.stdout.write(
            f"study sweep {sweep.pk}: {len(ids)} runs queued in experiment {experiment.pk} "
            f"('{experiment.name}')"
        )
        if earlier:
            self.stdout.write(
                f"  adds seeds: the experiment already held {earlier} study runs; "
                "repeated seeds count as extra runs of their variant"
            )

    def _study_experiment(self, owner, ref: str | None, default_name: str) -> Experiment:
        """The named experiment (``--experiment``), else a new one: submitting the same
        study twice gives two experiments ("... (2)"), not one with every seed twice."""
        if ref:
            return self._experiment(owner, ref, default_name)
        name, n = default_name, 1
        while Experiment.objects.filter(name=name).exists():
            n += 1
            name = f"{default_name} ({n})"
        return create_experiment(owner=owner, name=name)


def study_definition_dict(ref: str) -> dict:
    """A built-in study name (quick, full) or a path to STUDY.json, as a dict."""
    if ref in BUILTIN_STUDIES:
        return builtin_dict(ref)
    return _read_json(ref, "--study")


def _read_json(path: str, flag: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FieldError([(flag, f"no such file: {path}")]) from None
    except json.JSONDecodeError as exc:
        raise FieldError([(flag, f"not valid JSON: {exc}")]) from None
    if not isinstance(data, dict):
        raise FieldError([(flag, "the file must hold a JSON object")])
    return data
