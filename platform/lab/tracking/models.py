"""What the MLflow tracking API keeps of an external run beyond the lab's ``Run``.

The run itself is a ``runs.Run`` with ``origin = external`` (its metrics in the
lab's one metric store, ``runs.MetricStep``, under the lab's keys where
tracking/metric_map.py maps a name); this row holds the rest of MLflow's view of
it: tags, the latest value of each metric under the name the client logged,
the names stored under a lab key, and the millisecond times MLflow clients
send. Params are the run's ``config["params"]``. Writes:
tracking/services.py.
"""

from __future__ import annotations

from django.db import models

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

    def __str__(self) -> str:
        return f"MLflow record of run {self.run_id}"
