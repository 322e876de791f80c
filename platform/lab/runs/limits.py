"""Resource limits checked before anything is queued (settings, docs/platform.md "Limits").

* ``LAB_MAX_MODEL_PARAMS``: per deployment, the largest model a run may train,
  estimated from the config (``trainer.model.param_count``) without building it;
* ``LAB_MAX_QUEUED_RUNS_PER_USER``: how many runs one user may have waiting;
* ``LAB_MAX_SWEEP_RUNS``: how many runs one sweep or study may queue.

Each is a FieldError naming the limit and its setting, so the API answers 400
and the forms show it inline.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings

from lab.runs.models import Run, RunStatus
from trainer.config import ExperimentConfig
from trainer.errors import FieldError
from trainer.model.param_count import config_params, format_params


def check_model_size(cfg: ExperimentConfig, field: str = "model") -> None:
    limit = settings.LAB_MAX_MODEL_PARAMS
    count = config_params(cfg)
    if count > limit:
        raise FieldError(
            [
                (
                    field,
                    f"{format_params(count)} parameters exceed this deployment's limit of "
                    f"{format_params(limit)} (LAB_MAX_MODEL_PARAMS)",
                )
            ]
        )


def check_sweep_size(count: int, field: str = "grid") -> None:
    limit = settings.LAB_MAX_SWEEP_RUNS
    if count > limit:
        raise FieldError(
            [(field, f"{count} runs; a sweep holds at most {limit} (LAB_MAX_SWEEP_RUNS)")]
        )


def check_queued_runs(owner, adding: int) -> None:
    """Refuse ``adding`` more queued runs when ``owner`` would pass the per-user cap."""
    limit = settings.LAB_MAX_QUEUED_RUNS_PER_USER
    queued = Run.objects.filter(owner=owner, status=RunStatus.QUEUED).count()
    if queued + adding > limit:
        raise FieldError(
            [
                (
                    "",
                    f"you have {queued} runs queued; {adding} more would pass the limit of "
                    f"{limit} per user (LAB_MAX_QUEUED_RUNS_PER_USER): wait for some to "
                    "start or cancel some",
                )
            ]
        )


def check_new_runs(owner, configs: Sequence[ExperimentConfig], field: str = "model") -> None:
    """Every limit for queueing ``configs`` as ``owner``'s new runs."""
    seen: set[str] = set()
    for cfg in configs:
        # a sweep's runs mostly share one model; the vocabulary comes from the task
        key = f"{cfg.model.model_dump_json()} {cfg.task.name} {cfg.algorithm.name}"
        if key not in seen:
            seen.add(key)
            check_model_size(cfg, field)
    check_queued_runs(owner, len(configs))
