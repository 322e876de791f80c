"""Live worker registry: each Celery worker upserts its row every few seconds.

Celery's own inspect/ping cannot answer while a solo-pool worker is busy
training, so the workers page and /api/health read this table instead.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.utils import timezone


class Worker(models.Model):
    hostname = models.CharField(max_length=255, unique=True)
    queues = models.JSONField(default=list)
    pid = models.IntegerField(null=True)
    gpu_index = models.CharField(max_length=64, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now, db_index=True)
    current_run = models.ForeignKey(
        "runs.Run", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname

    @classmethod
    def live(cls, within_s: float = 30.0):
        return cls.objects.filter(last_seen__gte=timezone.now() - timedelta(seconds=within_s))
