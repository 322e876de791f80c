"""Experiment and Sweep: the schema and invariants; writes live in services.py."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class LiveExperimentManager(models.Manager):
    """Experiments not deleted (``Experiment.objects``): what every page lists."""

    def get_queryset(self):
        return super().get_queryset().filter(deleted_at__isnull=True)


class Experiment(models.Model):
    """A question a team studies; its runs share a base config.

    ``deleted_at``: deleted through MLflow's ``experiments/delete`` (with its runs),
    kept until ``experiments/restore``; ``Experiment.objects`` leaves it out,
    ``Experiment.all_objects`` finds it."""

    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="experiments"
    )
    tags = models.JSONField(default=list, blank=True, help_text="List of short labels.")
    base_config = models.JSONField(
        default=dict, blank=True, help_text="Fully resolved config new runs start from."
    )
    shared_with = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="shared_experiments",
        help_text="Teams (Django groups) whose members may queue runs and sweeps here, "
        "pin its baseline and give verdicts, like the owner (lab.experiments.rights).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deleted_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Set when deleted through MLflow's experiments/delete: hidden from every "
        "page (its runs too) until experiments/restore.",
    )

    objects = LiveExperimentManager()
    all_objects = models.Manager()

    class Meta:
        base_manager_name = "all_objects"
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "-created_at"])]

    def __str__(self) -> str:
        return self.name


class Sweep(models.Model):
    """A base config plus a grid over chosen fields x seeds; expands into runs.

    ``grid`` maps dotted field paths to the list of values to try, e.g.
    ``{"stabilizers.replay.mode": ["none", "r3"]}``; every combination is
    run once per seed in ``seeds``.
    """

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="sweeps")
    name = models.CharField(max_length=200, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="sweeps"
    )
    base_config = models.JSONField(default=dict)
    grid = models.JSONField(default=dict)
    seeds = models.JSONField(default=list)
    queue = models.CharField(max_length=64)
    study = models.JSONField(
        null=True,
        blank=True,
        help_text="The stability-study definition (trainer/studies/definition.py) this sweep runs, "
        "when it came from one: named variants x seeds instead of a grid.",
    )
    idempotency_key = models.CharField(
        max_length=200,
        blank=True,
        help_text="The submitter's Idempotency-Key header: a retried submit returns this "
        "sweep instead of creating another.",
    )
    request_fingerprint = models.CharField(
        max_length=64,
        blank=True,
        help_text="What the keyed request asked for (lab.runs.lifecycle.request_fingerprint): "
        "another request under the same key is refused, not answered with this sweep.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="sweep_idempotency_key_per_owner",
            ),
        ]

    def __str__(self) -> str:
        return self.name or f"sweep {self.pk}"
