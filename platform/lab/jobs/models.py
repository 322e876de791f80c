"""Live worker registry: each Celery worker upserts its row every few seconds.

Celery's own inspect/ping cannot answer while a solo-pool worker is busy
training, so the workers page and /api/health read this table instead.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.utils import timezone

from lab.jobs.capacity import ranks_per_node


class Worker(models.Model):
    hostname = models.CharField(max_length=255, unique=True)
    queues = models.JSONField(default=list)
    pid = models.IntegerField(null=True)
    gpu_index = models.CharField(max_length=64, blank=True)
    gpus = models.PositiveSmallIntegerField(
        default=0, help_text="GPUs this worker owns (0: a CPU worker; lab/jobs/capacity.py)."
    )
    cpu_slots = models.PositiveSmallIntegerField(
        default=1, help_text="Ranks a CPU worker may start (LAB_WORKER_CPU_SLOTS)."
    )
    started_at = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now, db_index=True)
    current_run = models.ForeignKey(
        "runs.Run", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    beat_pid = models.IntegerField(
        null=True, blank=True, help_text="The embedded scheduler's process (celery worker -B)."
    )
    beat_alive = models.BooleanField(
        null=True,
        blank=True,
        help_text="Whether that scheduler process was alive at last_seen; null: this worker "
        "embeds none. The reconciler is healthy only with a live one (lab/jobs/health.py).",
    )

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname

    @property
    def ranks_per_node(self) -> int:
        """The most ranks one run may ask of this worker (as WorkerCapacity.ranks_per_node)."""
        return ranks_per_node(self.gpus, self.cpu_slots)

    def capacity_text(self) -> str:
        if self.gpus:
            return f"{self.gpus} GPU" + ("s" if self.gpus != 1 else "")
        return f"{self.cpu_slots} CPU slot" + ("s" if self.cpu_slots != 1 else "")

    @classmethod
    def live(cls, within_s: float = 30.0):
        return cls.objects.filter(last_seen__gte=timezone.now() - timedelta(seconds=within_s))

    @classmethod
    def live_serving(cls, queue: str, within_s: float = 30.0) -> list[Worker]:
        """Live workers that consume ``queue`` (a JSON list, filtered here: few rows)."""
        return [w for w in cls.live(within_s) if queue in (w.queues or [])]
