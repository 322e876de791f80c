"""A run's lifecycle writes: create, submit, clone, cancel, delete (views, API and CLI call these).

Each function is one transaction. State changes that race with a worker
(cancel, claim, finish) are conditional UPDATEs on the status column, so two
actors can never both win. The worker's side (claim, finish, requeue) is
jobs/services.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from lab.configs import CONFIG_PREFIX, Overrides, check_reward_function, resolve_config
from lab.experiments.models import Experiment, Sweep
from lab.experiments.rights import NotAllowed, check_can_queue, check_priority_allowed, max_priority
from lab.runs.dispatch import new_task_id, send_run_on_commit
from lab.runs.limits import check_new_runs
from lab.runs.metrics.seal import seal_metrics
from lab.runs.models import Run, RunOrigin, RunStatus
from lab.text import clean_text
from trainer.config import ExperimentConfig
from trainer.errors import FieldError


class InvalidState(Exception):
    """The run's status does not allow this change."""


def check_queue(queue: str | None) -> str:
    """The queue to use (the default when none is given); FieldError for an unknown one."""
    queue = queue or settings.LAB_DEFAULT_QUEUE
    if queue not in settings.LAB_QUEUES:
        known = ", ".join(settings.LAB_QUEUES)
        raise FieldError([("queue", f"unknown queue '{queue}'; choose one of: {known}")])
    return queue


# Priorities run 0..9, higher first. 0 is the background: the demo `make up`
# queues (lab/runs/demo.py) and whatever a user queues to yield to everyone; a
# run given no priority queues at DEFAULT_PRIORITY, so it starts before them.
LOWEST_PRIORITY = 0
DEFAULT_PRIORITY = 1


def check_priority(priority: int | None) -> int:
    """The priority to use (DEFAULT_PRIORITY when none is given); FieldError outside 0..9."""
    if priority is None:
        return DEFAULT_PRIORITY
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise FieldError([("priority", "priority must be an integer from 0 to 9")])
    return priority


IDEMPOTENCY_KEY_MAX = 200


def check_idempotency_key(key: str | None) -> str:
    """The key to store ("" for none); FieldError when it cannot be stored."""
    key = (key or "").strip()
    if len(key) > IDEMPOTENCY_KEY_MAX:
        raise FieldError([("Idempotency-Key", f"at most {IDEMPOTENCY_KEY_MAX} characters")])
    return key


def submitted_with_key(owner, key: str) -> Run | None:
    """The run ``owner`` already submitted with this Idempotency-Key, if any."""
    if not key:
        return None
    return Run.objects.filter(owner=owner, idempotency_key=key).first()


class IdempotencyConflict(Exception):
    """An Idempotency-Key already stored something else (the API answers 422)."""

    def __init__(self, key: str, what: str):
        self.key, self.what = key, what
        super().__init__(
            f"Idempotency-Key {key!r} was used for {what} with a different request; "
            "send a new key for a new one"
        )


def request_fingerprint(**fields: Any) -> str:
    """One string for what a request asks to store (its resolved config, experiment,
    queue, priority, ...), spelling-independent: the same request retried has the
    same fingerprint, another request under the same key does not."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def run_fingerprint(run: Run) -> str:
    """The fingerprint of the request that stored ``run`` (from what it stored)."""
    return request_fingerprint(
        experiment=run.experiment_id, config=run.config, queue=run.queue, priority=run.priority
    )


def _same_run_or_conflict(earlier: Run, fingerprint: str, key: str) -> Run:
    if run_fingerprint(earlier) != fingerprint:
        raise IdempotencyConflict(key, f"run {earlier.pk}")
    earlier._idempotent_replay = True  # type: ignore[attr-defined]
    return earlier


def is_replay(stored: Any) -> bool:
    """Whether ``submit_run`` / ``create_sweep`` returned what an earlier request with
    the same Idempotency-Key stored (a retry), not something it created."""
    return bool(getattr(stored, "_idempotent_replay", False))


def run_dir_for(run: Run) -> Path:
    """The run folder the trainer writes (RUNS_DIR/run-000042)."""
    return Path(settings.RUNS_DIR) / f"run-{run.pk:06d}"


@transaction.atomic
def create_run(
    *,
    owner,
    experiment: Experiment,
    config: ExperimentConfig,
    queue: str | None = None,
    priority: int | None = None,
    variant: str = "",
    preset: str = "",
    sweep: Sweep | None = None,
    idempotency_key: str = "",
    raise_on_publish_failure: bool = False,
) -> Run:
    """Store a queued run and publish its wake-up after commit.

    A broker that refuses the message leaves the run stored and queued; the
    reconciler publishes it later (docs/platform.md, "The job's life"). With
    ``raise_on_publish_failure`` the caller also hears of it:
    ``dispatch.PublishFailed`` after the commit (the API answers 503)."""
    queue = check_queue(queue)
    priority = check_priority(priority)
    check_reward_function(
        config.task, prefix=f"{CONFIG_PREFIX}."
    )  # every stored run, whatever made it
    data = config.to_dict()
    run = Run.objects.create(
        experiment=experiment,
        sweep=sweep,
        owner=owner,
        variant=variant[:200],
        preset=preset,
        config=data,
        seed=data["run"]["seed"],
        gpus=data["run"]["gpus"],
        nodes=data["run"]["nodes"],
        queue=queue,
        priority=priority,
        max_attempts=settings.LAB_MAX_ATTEMPTS,
        total_steps=data["run"]["steps"],
        task_id=new_task_id(),
        queued_at=timezone.now(),
        published_at=timezone.now(),
        idempotency_key=idempotency_key,
    )
    run.run_dir = str(run_dir_for(run))
    run.save(update_fields=["run_dir"])
    send_run_on_commit(
        run.pk, run.queue, run.priority, run.task_id, raise_on_failure=raise_on_publish_failure
    )
    return run


def submit_run(
    *,
    owner,
    experiment: Experiment,
    config: Mapping[str, Any] | None = None,
    preset: str | None = None,
    overrides: Overrides = None,
    queue: str | None = None,
    priority: int | None = None,
    variant: str = "",
    idempotency_key: str = "",
    raise_on_publish_failure: bool = False,
) -> Run:
    """Check rights, resolve and validate, check the limits, then create: nothing
    is stored unless every check passes (NotAllowed, FieldError).

    With an ``idempotency_key`` the owner already used, the run stored then is
    returned and nothing new is created (also when two retries race), if this
    request asks for the same run; ``IdempotencyConflict`` if it asks for another."""
    check_can_queue(owner, experiment)
    queue = check_queue(queue)
    priority = check_priority(priority)
    check_priority_allowed(owner, priority)
    variant = clean_text("variant", variant, max_length=200)
    idempotency_key = check_idempotency_key(idempotency_key)
    cfg = resolve_config(config, preset, overrides, base=experiment.base_config or None)
    # One key, one request, one run: the database's unique (owner, key) decides which of
    # two racing requests stores its run; the other gets that run only if it asked for
    # the same thing (IdempotencyConflict otherwise), never the other request's run.
    fingerprint = request_fingerprint(
        experiment=experiment.pk,
        config=json.loads(json.dumps(cfg.to_dict())),  # as the JSON field stores it
        queue=queue,
        priority=priority,
    )
    if (earlier := submitted_with_key(owner, idempotency_key)) is not None:
        return _same_run_or_conflict(earlier, fingerprint, idempotency_key)
    check_new_runs(owner, [cfg])
    try:
        return create_run(
            owner=owner,
            experiment=experiment,
            config=cfg,
            queue=queue,
            priority=priority,
            variant=variant or preset or "",
            preset=preset or "",
            idempotency_key=idempotency_key,
            raise_on_publish_failure=raise_on_publish_failure,
        )
    except IntegrityError:
        earlier = submitted_with_key(owner, idempotency_key)
        if earlier is None:
            raise
        return _same_run_or_conflict(earlier, fingerprint, idempotency_key)


@transaction.atomic
def clone_run(run: Run, *, owner, overrides: Overrides = None, queue: str | None = None) -> Run:
    """A new queued run with the source's config plus overrides, in the source's
    experiment (so the cloner must be allowed to queue there), at ``clone_priority``."""
    check_can_queue(owner, run.experiment)
    cfg = resolve_config(run.config, None, overrides)
    check_new_runs(owner, [cfg])
    return create_run(
        owner=owner,
        experiment=run.experiment,
        config=cfg,
        queue=queue or run.queue,
        priority=clone_priority(run, owner),
        variant=run.variant,
        preset=run.preset,
    )


def clone_priority(run: Run, owner) -> int:
    """A clone is the cloner's new run: the source's priority, but never below the
    default (a clone of a demo run does not wait behind the demo) nor above what
    the cloner may give."""
    return min(max(run.priority, DEFAULT_PRIORITY), max_priority(owner))


def cancel_run(run: Run, *, user) -> Run:
    """Cooperative cancel. A queued run is cancelled without starting; a running
    run gets the flag its worker polls (the worker SIGTERMs the trainer, which
    checkpoints and exits). A finished run is left as it is."""
    if not run.can_manage(user):
        raise NotAllowed("only the run's owner or staff can cancel it")
    if run.is_external:  # its trainer runs elsewhere and polls no flag of ours
        raise InvalidState("an external run is trained elsewhere; the lab cannot cancel it")
    with transaction.atomic():
        cancelled = _cancel_if_waiting(run.pk)
        if not cancelled:
            Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(cancel_requested=True)
    if cancelled:  # a requeued run keeps its earlier attempts' metrics
        seal_metrics(run.pk)
    run.refresh_from_db()
    return run


def mark_lost_external_runs(after_s: float) -> list[int]:
    """External runs (trained elsewhere, logged through lab.tracking) that sent nothing
    for ``after_s`` seconds become ``lost``: a job killed without ending its run
    (a verl job's host gone) would otherwise stay running, and count as a surviving
    seed, for ever. A conditional UPDATE on the last contact, so a run that writes
    at the same moment stays running. Returns the runs marked."""
    cutoff = timezone.now() - timedelta(seconds=after_s)
    silent = Run.objects.filter(status=RunStatus.RUNNING, origin=RunOrigin.EXTERNAL).filter(
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
    )
    marked = list(silent.values_list("pk", flat=True)[:1000])
    if marked:
        Run.objects.filter(pk__in=marked).filter(
            Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True), status=RunStatus.RUNNING
        ).update(
            status=RunStatus.LOST,
            error=f"sent nothing for {after_s:g} s (LAB_EXTERNAL_LOST_AFTER_S): outcome unknown",
        )
    return marked


def delete_run(run: Run, *, user) -> None:
    """Delete a run that is not training. Soft, as MLflow's DeleteRun: the run leaves
    every page, list and review (``Run.deleted_at``; the default manager hides it)
    while its metrics, comments and folder stay, so ``restore_run`` puts it back. A
    waiting run is cancelled as it goes, so no worker starts it."""
    if not run.can_manage(user):
        raise NotAllowed("only the run's owner or staff can delete it")
    now = timezone.now()
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status == RunStatus.RUNNING:
            raise InvalidState("cancel the run and wait for it to stop before deleting it")
        waiting = _cancel_if_waiting(locked.pk)
        Run.objects.filter(pk=locked.pk).update(deleted_at=now)
    if waiting:
        seal_metrics(run.pk)


def _cancel_if_waiting(run_pk: int) -> bool:
    """Cancel the run if it is still queued (a conditional update: a worker that claims
    it first wins); whether it was."""
    return bool(
        Run.objects.filter(pk=run_pk, status=RunStatus.QUEUED).update(
            status=RunStatus.CANCELLED, cancel_requested=True, finished_at=timezone.now()
        )
    )


@transaction.atomic
def restore_run(run: Run, *, user) -> None:
    """Put a deleted run back where it was (the run's owner or staff); refused while
    its experiment is deleted (restore the experiment first)."""
    if not run.can_manage(user):
        raise NotAllowed("only the run's owner or staff can restore it")
    locked = Run.all_objects.select_for_update().select_related("experiment").get(pk=run.pk)
    if locked.deleted_at is None:
        raise InvalidState(f"run {run.pk} is not deleted")
    if locked.experiment.deleted_at is not None:
        raise InvalidState(f"run {run.pk}'s experiment is deleted: restore the experiment first")
    Run.all_objects.filter(pk=locked.pk).update(deleted_at=None)
