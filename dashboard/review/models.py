"""Team review: verdicts on runs, saved comparisons and their comments, pinned baselines.

Writes go through dashboard/review/services.py. Comments on runs are the platform's
``runs.Comment``; comments on saved comparisons live here.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse

from lab.experiments.models import Experiment
from lab.runs.models import Run


class VerdictLabel(models.TextChoices):
    STABLE = "stable", "stable"
    COLLAPSED = "collapsed", "collapsed"
    NEEDS_RERUN = "needs_rerun", "needs rerun"


class Verdict(models.Model):
    """A reviewer's call on a run. A run's verdict is its latest one; older ones are history."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="verdicts")
    label = models.CharField(max_length=16, choices=VerdictLabel.choices)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="verdicts"
    )
    note = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["run", "-created_at"])]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(label__in=VerdictLabel.values), name="verdict_label_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.get_label_display()} on run {self.run_id}"


class SavedComparison(models.Model):
    """A named set of runs (and the baseline they are drawn against) with a shareable URL."""

    name = models.CharField(max_length=200)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="saved_comparisons"
    )
    run_ids = models.JSONField(help_text="Ids of the compared runs, in display order.")
    baseline = models.ForeignKey(
        Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("dashboard:comparison", args=[self.pk])

    def can_manage(self, user) -> bool:
        """Only the owner or staff may delete it; the team may view and comment."""
        return bool(user and user.is_authenticated and (user.is_staff or user.pk == self.owner_id))


class ComparisonComment(models.Model):
    comparison = models.ForeignKey(
        SavedComparison, on_delete=models.CASCADE, related_name="comments"
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="comparison_comments"
    )
    body = models.TextField(max_length=10000)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"comment {self.pk} on comparison {self.comparison_id}"


class BaselinePin(models.Model):
    """The run an experiment's charts are drawn against (one per experiment)."""

    experiment = models.OneToOneField(
        Experiment, on_delete=models.CASCADE, related_name="baseline_pin"
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    pinned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    pinned_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"baseline of experiment {self.experiment_id}: run {self.run_id}"
