"""Run, its metrics and comments: schema and invariants (writes: runs/lifecycle.py,
runs/sweeps.py, runs/comments.py and the metric store runs/metrics/).

Metric storage (measured in bench/metric_storage.py, written up in
docs/platform.md): ONE row per (run, step) holding every scalar and the
per-layer expert-load vectors of that step as one JSON object.

- idempotent: unique (run, step) and a bulk upsert, so a re-read or resumed
  metrics.jsonl never duplicates a step;
- batch-written: one INSERT ... ON CONFLICT per batch of steps;
- read in one query for a whole run set (the steps no column holds yet, see
  below): the selected keys are extracted in SQL and aggregated per run
  (runs/metrics/read.py ``metric_series_many``), so only what a figure needs
  leaves the database, on SQLite and PostgreSQL alike.

Steps a run has moved past do not change (a resumed trainer rewrites some,
which is handled), so they are also kept as columns: ``MetricColumn``, one
row per run, key and chunk of ``CHUNK_STEPS`` steps, binary arrays. A
comparison reads a few hundred small blobs plus the rows of each run's
unsealed tail, instead of extracting every key from every step's JSON
(docs/platform.md "Metric columns", docs/benchmarks.md compare page).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from lab.experiments.models import Experiment, Sweep


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # An external run that sent nothing for LAB_EXTERNAL_LOST_AFTER_S: its outcome is
    # unknown (not a seed of the stability review); it is running again if it reports
    # again, or its owner ends it from its page.
    LOST = "lost"


class RunOrigin(models.TextChoices):
    LAB = "lab"  # trained by the lab's workers
    EXTERNAL = "external"  # trained elsewhere, logged through lab.tracking (MLflow, TensorBoard)


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)
FINAL_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


class LiveRunManager(models.Manager):
    """Runs not deleted: every page, list and review reads these (``Run.objects``)."""

    def get_queryset(self):
        return super().get_queryset().filter(deleted_at__isnull=True)


class Run(models.Model):
    """One training run. Collapse is a result (summary.collapsed), not a status.

    ``deleted_at``: an external run deleted through MLflow's ``runs/delete`` is
    kept (soft delete) until restored (``runs/restore``); ``Run.objects`` (the
    default manager, also behind ``experiment.runs``) leaves it out everywhere,
    ``Run.all_objects`` still finds it."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    sweep = models.ForeignKey(
        Sweep, on_delete=models.SET_NULL, null=True, blank=True, related_name="runs"
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runs"
    )
    variant = models.CharField(max_length=200, blank=True, help_text="Label within a comparison.")
    preset = models.CharField(max_length=100, blank=True)
    config = models.JSONField(help_text="Fully resolved, validated config.")
    seed = models.IntegerField()

    status = models.CharField(
        max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED, db_index=True
    )
    queue = models.CharField(max_length=64, help_text="Hardware queue, e.g. cpu or gpu-a100.")
    priority = models.SmallIntegerField(default=0, help_text="Higher runs first (0-9).")
    task_id = models.CharField(max_length=64, blank=True)
    worker_host = models.CharField(max_length=255, blank=True)
    gpu_index = models.CharField(max_length=64, blank=True, help_text="CUDA_VISIBLE_DEVICES.")
    gpus = models.PositiveSmallIntegerField(
        default=1,
        help_text="Ranks the run needs on one worker (its config's run.gpus): only a worker "
        "owning that many GPUs (or CPU slots) claims it.",
    )
    nodes = models.PositiveSmallIntegerField(
        default=1,
        help_text="Workers the run spans (its config's run.nodes); more than 1 is "
        "gang-scheduled: lab/jobs/gang.py.",
    )
    gang = models.JSONField(
        default=list,
        blank=True,
        help_text="This attempt's members, in the order they joined: "
        '[{"worker": host, "node": 0}, ...]; node 0 leads (ingests metrics, finishes the run).',
    )
    rdzv_endpoint = models.CharField(
        max_length=255,
        blank=True,
        help_text="host:port of this attempt's torchrun c10d rendezvous (a gang's leader hosts it).",
    )
    attempts = models.PositiveSmallIntegerField(
        default=0,
        help_text="Claims so far; also the fencing token every write of an attempt is checked "
        "against (heartbeat, metrics, finish).",
    )
    max_attempts = models.PositiveSmallIntegerField(default=3)
    cancel_requested = models.BooleanField(default=False)
    paused = models.BooleanField(
        default=False,
        help_text="Held out of the queue (its sweep was paused): no worker claims it, and a "
        "training run stops at a checkpoint and comes back queued and paused, its attempt "
        "given back; resuming queues it where its priority and age put it (lab.runs.bulk).",
    )

    created_at = models.DateTimeField(auto_now_add=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    published_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Last wake-up sent to the broker (the reconciler "
        "re-sends one for a run queued longer than LAB_REPUBLISH_AFTER_S since).",
    )
    idempotency_key = models.CharField(
        max_length=200,
        blank=True,
        help_text="The submitter's Idempotency-Key header: "
        "a retried submit returns this run instead of creating another.",
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    current_step = models.BigIntegerField(
        default=0, help_text="Steps whose metrics are stored (the last step + 1)."
    )
    phase = models.CharField(
        max_length=16,
        blank=True,
        help_text="What the trainer is doing: '' (not started), 'warmstart' (the SFT base "
        "policy, before step 0) or 'training' (RL steps); from RUN_DIR/progress.json.",
    )
    phase_progress = models.JSONField(
        null=True,
        blank=True,
        help_text="The trainer's progress.json: warmstart/step, accuracy, target, eta_s, cached.",
    )
    metric_chunks_sealed = models.PositiveBigIntegerField(
        default=0,
        help_text="Leading chunks of CHUNK_STEPS steps whose metrics are kept as columns "
        "(MetricColumn); steps from chunk number metric_chunks_sealed on are read from rows.",
    )
    total_steps = models.BigIntegerField()
    summary = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    field_errors = models.JSONField(
        default=dict,
        blank=True,
        help_text="The config fields a failed run was refused on where it was to train "
        "(the trainer's exit code 2, or the worker's check of its paths): {dotted path: "
        "[messages]}. Such a run is cloned and fixed (the run form shows them at their "
        "fields), never requeued: it would fail the same way.",
    )
    run_dir = models.CharField(max_length=500, blank=True)
    origin = models.CharField(
        max_length=16,
        choices=RunOrigin.choices,
        default=RunOrigin.LAB,
        help_text="lab: trained by the lab's workers; external: trained elsewhere and logged "
        "to the lab (lab.tracking), so nothing here can cancel, requeue or export it.",
    )
    source = models.JSONField(
        default=dict,
        blank=True,
        help_text="Where an external run came from: "
        '{"client": "mlflow-python-client/3.1", "framework": "verl", "host": "10.0.0.7", '
        '"source_name": "main_ppo.py"}; empty for a lab run.',
    )
    deleted_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Set when deleted through MLflow's runs/delete (or with its experiment): "
        "hidden from every page until runs/restore.",
    )

    objects = LiveRunManager()
    all_objects = models.Manager()

    class Meta:
        base_manager_name = "all_objects"
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["queue", "status", "-priority", "created_at"]),
            models.Index(fields=["status", "heartbeat_at"]),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=RunStatus.values), name="run_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=0, priority__lte=9), name="run_priority_0_9"
            ),
            models.CheckConstraint(
                condition=Q(current_step__gte=0, total_steps__gte=1), name="run_steps_valid"
            ),
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="run_idempotency_key_per_owner",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.variant or self.preset or 'custom'})"

    @property
    def is_external(self) -> bool:
        return self.origin == RunOrigin.EXTERNAL

    @property
    def failed_on_config(self) -> bool:
        return self.status == RunStatus.FAILED and bool(self.field_errors)

    @property
    def waits_paused(self) -> bool:
        """Queued but held back: no worker claims it until it is resumed."""
        return self.paused and self.status == RunStatus.QUEUED

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def progress(self) -> float:
        return min(1.0, self.current_step / self.total_steps) if self.total_steps else 0.0

    @property
    def collapsed(self) -> bool | None:
        return (self.summary or {}).get("collapsed")

    @property
    def gang_members(self) -> list[dict]:
        """The gang of the current attempt, in join order (node 0 first): each member
        row carries the attempt it joined, so an earlier attempt's gang is never it."""
        return [m for m in (self.gang or []) if m.get("attempt") == self.attempts]

    def can_manage(self, user) -> bool:
        """Only the owner or staff may cancel or delete a run (the team may view)."""
        return bool(user and user.is_authenticated and (user.is_staff or user.pk == self.owner_id))


class MetricStep(models.Model):
    """All metrics of one step of one run: {"reward/accuracy": 0.4, "experts/load/L0": [...]}."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_steps")
    step = models.BigIntegerField()  # an external run's steps reach 2^53 - 1 (tracking/payload.py)
    values = models.JSONField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "step"], name="metric_step_unique"),
        ]
        ordering = ["run", "step"]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step}"


# The MetricColumn key of a chunk's row of stored steps (no metric key is empty).
STEPS_COLUMN = ""


class MetricColumn(models.Model):
    """One metric of one chunk of one run as arrays: a copy of its MetricStep rows.

    A run's steps are cut into chunks of ``runs.metrics.columns.CHUNK_STEPS`` (chunk
    ``c`` holds steps ``c*CHUNK_STEPS`` to ``(c+1)*CHUNK_STEPS - 1``). The
    run's first ``Run.metric_chunks_sealed`` chunks have columns, the rest is
    read from the rows. ``runs.metrics.seal.seal_metrics`` seals every chunk the
    run has moved past (a later chunk has rows) and, once the run is final,
    its last one too; a write of rows into a sealed chunk (a resumed trainer
    rewinding, a lost worker's late lines) unseals that chunk and every later
    one in the same transaction, so columns always equal the rows they copy.

    - key ``STEPS_COLUMN`` (""): ``steps`` holds the chunk's stored steps;
    - a scalar key: ``steps`` int64 little-endian, or empty when the key is at
      every stored step of the chunk; ``values`` float64 little-endian, NaN
      for a stored null (or a non-number under a scalar key);
    - a vector key (``experts/load/L*``): ``values`` is the UTF-8 JSON array
      of the stored vectors (null for a stored null).

    Only the steps that HAVE the key are in its column (a metric logged every
    10 steps is a 10x shorter column), as in ``runs.metrics.read.RunSeries``.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_columns")
    key = models.CharField(max_length=200, blank=True)
    chunk = models.PositiveBigIntegerField()
    steps = models.BinaryField()
    values = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "chunk", "key"], name="metric_column_unique"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} chunk {self.chunk} column {self.key or '(steps)'}"


class Comment(models.Model):
    """A note on a run or on a whole experiment (comparisons comment on the experiment)."""

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, null=True, blank=True, related_name="comments"
    )
    experiment = models.ForeignKey(
        Experiment, on_delete=models.CASCADE, null=True, blank=True, related_name="comments"
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="comments"
    )
    body = models.TextField(max_length=10000)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(run__isnull=False) | Q(experiment__isnull=False),
                name="comment_has_target",
            )
        ]

    def __str__(self) -> str:
        return f"comment {self.pk} by {self.author_id}"


class ExportStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class CheckpointExport(models.Model):
    """A run's checkpoint written as a Hugging Face folder (trainer.hf.export) by
    the worker on the ``control`` queue: requested from the run page or the API
    (writes: runs/exports.py)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="exports")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    step = models.BigIntegerField(help_text="RL steps of the checkpoint exported.")
    dtype = models.CharField(max_length=16, default="float32")
    status = models.CharField(
        max_length=16, choices=ExportStatus.choices, default=ExportStatus.QUEUED
    )
    out_dir = models.CharField(max_length=500, help_text="The folder transformers loads.")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"export of run {self.run_id} step {self.step} ({self.status})"
