"""RegisteredModel and RegisteredDataset: the schema; writes (with the checks on the
files) live in services.py."""

from __future__ import annotations

from django.conf import settings
from django.db import models

NAME_HELP = "Letters, digits, '.', '_' and '-', starting with a letter or digit; unique."


class Verifier(models.TextChoices):
    NUMERIC = "numeric", "numeric (#### or \\boxed{}, within tolerance)"
    EXACT = "exact", "exact match"
    CHOICE = "choice", "multiple choice (A, B, C, D)"


class DatasetStatus(models.TextChoices):
    """A registered file's check (datasets and models alike)."""

    CHECKING = "checking"  # a large file, queued for the control worker's check
    READY = "ready"
    FAILED = "failed"  # the check refused the file; ``error`` says why


class RegisteredModel(models.Model):
    """A Hugging Face checkpoint folder on the shared run volume, checked when registered
    (folder, supported config.json family, tokenizer, chat template, weight dtypes, and
    every weight finite); runs pick it as model.source once it is ready. A checkpoint
    larger than LAB_MODEL_INLINE_BYTES has its weights scanned by the control queue's
    worker, outside the request."""

    name = models.CharField(max_length=100, unique=True, help_text=NAME_HELP)
    path = models.CharField(max_length=1000, help_text="Absolute checkpoint folder.")
    family = models.CharField(max_length=32, help_text="config.json model_type.")
    model_fields = models.JSONField(
        default=dict, help_text="The model section's shape fields config.json gives."
    )
    total_params = models.BigIntegerField()
    active_params = models.BigIntegerField()
    vocab_size = models.IntegerField(help_text="Tokens of the checkpoint's tokenizer.json.")
    status = models.CharField(
        max_length=16, choices=DatasetStatus.choices, default=DatasetStatus.READY
    )
    error = models.TextField(blank=True, help_text="Why the weight scan refused the checkpoint.")
    description = models.TextField(blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="registered_models"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RegisteredDataset(models.Model):
    """A JSONL/Parquet file of prompts and answers, checked when registered (it parses
    and has the named fields); runs pick it as their text task's data file once it is
    ready. A large file is checked by the control queue's worker, outside the request."""

    name = models.CharField(max_length=100, unique=True, help_text=NAME_HELP)
    path = models.CharField(max_length=1000, help_text="Absolute file path (or a shipped name).")
    prompt_field = models.CharField(max_length=100, default="question")
    prompt_template = models.TextField(blank=True, help_text="Empty = the prompt field as is.")
    answer_field = models.CharField(max_length=100, default="answer")
    verifier = models.CharField(max_length=16, choices=Verifier.choices, default=Verifier.NUMERIC)
    rows = models.IntegerField(default=0, help_text="Rows in the file when checked.")
    problems = models.IntegerField(
        default=0, help_text="Usable rows (the rest are counted as bad)."
    )
    status = models.CharField(
        max_length=16, choices=DatasetStatus.choices, default=DatasetStatus.READY
    )
    error = models.TextField(blank=True, help_text="Why the check refused the file.")
    skipped = models.JSONField(
        default=dict,
        blank=True,
        help_text="Rows skipped when registered: reason -> {count, lines (the first few)}.",
    )
    description = models.TextField(blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="registered_datasets"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
