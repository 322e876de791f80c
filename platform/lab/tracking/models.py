"""What the MLflow tracking API keeps of an external run beyond the lab's ``Run``.

The run itself is a ``runs.Run`` with ``origin = external`` (its metrics in the
lab's one metric store, ``runs.MetricStep``, under the lab's keys where
tracking/metric_map.py maps a name); ``TrackedRun`` holds the rest of MLflow's
view of it: tags, the latest value of each metric under the name the client
logged, the names stored under a lab key, the millisecond times MLflow clients
send, its parent (nested runs) and its dataset inputs. Params are the run's
``config["params"]``. ``MetricPoint`` keeps every logged point as it came
(MLflow's metric history); ``TrackedExperiment`` an experiment's MLflow tags;
``LoggedModel``, ``RegisteredModel`` and ``ModelVersion`` MLflow 3's logged
models and the model registry. Writes: tracking/services.py,
tracking/experiments.py, tracking/models_services.py.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from lab.experiments.models import Experiment
from lab.runs.models import Run


class TrackedRun(models.Model):
    """MLflow's record of one external run. The MLflow ``run_id`` is ``str(run.pk)``."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="+")
    params = models.JSONField(
        default=dict, blank=True, help_text="{key: value}; MLflow params are written once."
    )
    tags = models.JSONField(default=dict, blank=True, help_text="{key: value}")
    latest_metrics = models.JSONField(
        default=dict,
        blank=True,
        help_text="{name as logged: [value, timestamp_ms, step]}: the point with the largest "
        "(step, timestamp), as MLflow's run view shows it; null for a non-finite value.",
    )
    stored_as = models.JSONField(
        default=dict,
        blank=True,
        help_text="{name as logged: lab key} for names stored under a lab key "
        "(tracking/metric_map.py).",
    )
    start_time = models.BigIntegerField(null=True, blank=True, help_text="ms since the epoch")
    end_time = models.BigIntegerField(null=True, blank=True, help_text="ms since the epoch")
    parent = models.ForeignKey(
        Run,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="tracked_children",
        help_text="The parent run of a nested run (MLflow's tag mlflow.parentRunId).",
    )
    inputs = models.JSONField(
        default=list,
        blank=True,
        help_text="MLflow's dataset inputs (runs/log-inputs): [{dataset: {name, digest, "
        "source_type, source, schema, profile}, tags: [{key, value}]}], one per digest "
        "and context.",
    )
    outputs = models.JSONField(
        default=list,
        blank=True,
        help_text="MLflow 3's model outputs (runs/outputs): [{model_id, step}].",
    )
    deleted_time = models.BigIntegerField(
        null=True, blank=True, help_text="ms since the epoch; the run's Run.deleted_at"
    )
    distributions = models.JSONField(
        default=list,
        blank=True,
        help_text="The run's distribution keys (dist/<tag>: imported TensorBoard histograms), "
        "drawn as distribution panels on the run page.",
    )
    import_notes = models.JSONField(
        default=list,
        blank=True,
        help_text="What an import could not store, one line each with the reason "
        "(a TensorBoard text summary, an image, ...).",
    )

    def __str__(self) -> str:
        return f"MLflow record of run {self.run_id}"


class TrackedExperiment(models.Model):
    """MLflow's key-value tags of an experiment (the lab's own ``Experiment.tags`` are
    labels); made on the first ``set-experiment-tag``."""

    experiment = models.OneToOneField(
        Experiment, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    tags = models.JSONField(default=dict, blank=True, help_text="{key: value}")

    def __str__(self) -> str:
        return f"MLflow record of experiment {self.experiment_id}"


class NonFinite(models.IntegerChoices):
    """How a point's value is stored: finite in ``value``, else which IEEE special."""

    FINITE = 0
    NAN = 1
    POS_INF = 2
    NEG_INF = 3


class MetricPoint(models.Model):
    """One metric point exactly as an MLflow client (or a TensorBoard file) logged it:
    name as logged, step, its own timestamp, value. Two points at one step are two
    rows; the same point sent twice (a retried batch) is one (the unique key).

    The primary key, (run, key, timestamp, step, value, nonfinite), is also the index
    history reads in MLflow's order: ``WHERE run = ? AND key = ? ORDER BY timestamp,
    step, value`` (mlflow/store/tracking/sqlalchemy_store.py, get_metric_history)."""

    # MLflow's own primary key for its metrics table, led by the run so that one
    # index serves both the dedupe of a retried batch and the history read. No
    # surrogate id: on SQLite the table is WITHOUT ROWID (migration 0004), one
    # B-tree holding the rows in key order instead of a rowid table plus a unique
    # index repeating every column; on PostgreSQL one index instead of two
    # (docs/benchmarks-archive.md, "MLflow ingestion").
    pk = models.CompositePrimaryKey("run", "key", "timestamp", "step", "value", "nonfinite")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=250)
    step = models.BigIntegerField()
    timestamp = models.BigIntegerField(help_text="ms since the epoch")
    value = models.FloatField(help_text="0 when the value is not finite (see nonfinite)")
    nonfinite = models.SmallIntegerField(choices=NonFinite.choices, default=NonFinite.FINITE)

    def __str__(self) -> str:
        return f"run {self.run_id} {self.key} step {self.step}"


class LoggedModelStatus(models.TextChoices):
    PENDING = "LOGGED_MODEL_PENDING"
    READY = "LOGGED_MODEL_READY"
    FAILED = "LOGGED_MODEL_UPLOAD_FAILED"


class LoggedModel(models.Model):
    """MLflow 3's logged model (``mlflow.<flavor>.log_model``, transformers' checkpoint
    upload): a folder of artifacts under
    ``mlflow-artifacts:/<experiment>/models/<model_id>/artifacts``, usually made by a run."""

    model_id = models.CharField(max_length=40, primary_key=True, help_text="m-<32 hex>")
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="+")
    source_run = models.ForeignKey(
        Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="logged_models"
    )
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    name = models.CharField(max_length=250)
    model_type = models.CharField(max_length=250, blank=True)
    status = models.CharField(
        max_length=32, choices=LoggedModelStatus.choices, default=LoggedModelStatus.PENDING
    )
    status_message = models.TextField(blank=True)
    tags = models.JSONField(default=dict, blank=True)
    params = models.JSONField(default=dict, blank=True)
    metrics = models.JSONField(default=list, blank=True, help_text="MLflow Metric dicts")
    created_ms = models.BigIntegerField()
    updated_ms = models.BigIntegerField()
    deleted = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["experiment", "-created_ms"])]

    def __str__(self) -> str:
        return f"logged model {self.model_id} ({self.name})"


class RegisteredModel(models.Model):
    """A name in MLflow's model registry; its versions point at logged models or runs."""

    name = models.CharField(max_length=250, unique=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    description = models.TextField(blank=True)
    tags = models.JSONField(default=dict, blank=True)
    aliases = models.JSONField(default=dict, blank=True, help_text="{alias: version}")
    created_ms = models.BigIntegerField()
    updated_ms = models.BigIntegerField()

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    """One version of a registered model: where its files are (``source``), the run and
    logged model it came from, its stage and tags."""

    registered_model = models.ForeignKey(
        RegisteredModel, on_delete=models.CASCADE, related_name="versions"
    )
    version = models.PositiveIntegerField()
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    source = models.CharField(max_length=1000)
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    model_id = models.CharField(max_length=40, blank=True)
    run_link = models.CharField(max_length=500, blank=True)
    description = models.TextField(blank=True)
    stage = models.CharField(max_length=20, default="None")
    status = models.CharField(max_length=20, default="READY")
    tags = models.JSONField(default=dict, blank=True)
    created_ms = models.BigIntegerField()
    updated_ms = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["registered_model", "version"], name="model_version_unique"
            )
        ]
        ordering = ["registered_model", "version"]

    def __str__(self) -> str:
        return f"{self.registered_model.name} v{self.version}"


class ImportStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class TensorBoardImportJob(models.Model):
    """One import of a TensorBoard event folder into an external run, done by the
    control queue's worker (or within the request for a small folder): every job
    ends succeeded or failed, with the points read and skipped and each file's
    records and problems (tracking/tb_jobs.py)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    folder = models.CharField(max_length=4096)
    steps_per_rollout = models.PositiveIntegerField(null=True, blank=True)
    final = models.BooleanField(
        default=True, help_text="End the run when the import ends (false: a folder followed)."
    )
    status = models.CharField(
        max_length=16, choices=ImportStatus.choices, default=ImportStatus.QUEUED, db_index=True
    )
    points = models.BigIntegerField(default=0, help_text="Points stored.")
    skipped = models.BigIntegerField(
        default=0, help_text="Scalar events not stored (a step out of range, a tag too long)."
    )
    files = models.JSONField(
        default=list, blank=True, help_text="[{file, bytes, records, problem}] per event file."
    )
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"TensorBoard import {self.pk} of run {self.run_id} ({self.status})"
