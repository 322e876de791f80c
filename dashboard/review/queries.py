"""Reads of the dashboard pages. Each function is a fixed number of queries,
whatever the number of runs: the pages' query counts are tested for that.

Metric series come from the platform's ``runs.metrics.read.metric_series_many``
(two queries for a whole run set: the columns of every run's sealed chunks
of steps, then the rows after them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from django.conf import settings
from django.db.models import QuerySet
from pydantic import ValidationError

from dashboard.charts.aggregate import Series
from dashboard.charts.figures import CollapseMarker
from dashboard.charts.stability import RunStats
from dashboard.charts.survival import RunOutcome
from dashboard.review.models import BaselinePin, Verdict
from lab.experiments.models import Experiment
from lab.runs.metrics.read import RunSeries, metric_series_many, metric_step_ranges
from lab.runs.models import Run
from trainer import metric_keys as mk
from trainer.analysis.run_record import GAP_STEPS, RunRecord, mean_gap
from trainer.config import ExperimentConfig
from trainer.run_folder.files import LOG_FILE

LOG_TAIL_BYTES = 16 * 1024

SORTS: dict[str, str] = {
    "newest": "-created_at",
    "oldest": "created_at",
    "id": "pk",
    "-id": "-pk",
    "status": "status",
    "experiment": "experiment__name",
    "owner": "owner__username",
    "queue": "queue",
    "variant": "variant",
    "progress": "-current_step",
}


def run_label(run: Run) -> str:
    """A run's unique name on charts and legends: '#12 r3 s0'."""
    return f"#{run.pk} {run.variant or run.preset or 'run'} s{run.seed}"


def variant_of(run: Run) -> str:
    """The group a run is aggregated in across seeds."""
    return run.variant or run.preset or f"run {run.pk}"


def parents_of(run_ids: Sequence[int]) -> dict[int, int]:
    """{run id: its parent's id} of the nested runs among ``run_ids`` (MLflow's
    mlflow.parentRunId, lab/tracking); one query."""
    from lab.tracking.models import TrackedRun

    return dict(
        TrackedRun.objects.filter(run_id__in=list(run_ids), parent__isnull=False).values_list(
            "run_id", "parent_id"
        )
    )


def runs_in_order(ids: Sequence[int]) -> list[Run]:
    """The runs with these ids, in the order given (unknown ids are skipped); one query."""
    by_id = {
        r.pk: r for r in Run.objects.filter(pk__in=list(ids)).select_related("experiment", "owner")
    }
    return [by_id[i] for i in ids if i in by_id]


def filtered_runs(
    *,
    status: str = "",
    experiment: int | None = None,
    tag: str = "",
    owner: str = "",
    queue: str = "",
    sort: str = "newest",
) -> QuerySet[Run]:
    """The runs list's queryset. A tag filter costs one extra query (experiment tags
    are a JSON list, and SQLite cannot search inside it)."""
    runs = Run.objects.select_related("experiment", "owner", "sweep")
    if status:
        runs = runs.filter(status=status)
    if experiment:
        runs = runs.filter(experiment_id=experiment)
    if tag:
        tagged = [
            pk for pk, tags in Experiment.objects.values_list("pk", "tags") if tag in (tags or [])
        ]
        runs = runs.filter(experiment_id__in=tagged)
    if owner:
        runs = runs.filter(owner__username=owner)
    if queue:
        runs = runs.filter(queue=queue)
    return runs.order_by(SORTS.get(sort, SORTS["newest"]), "-pk")


def latest_verdicts(run_ids: Iterable[int]) -> dict[int, Verdict]:
    """Each run's current (latest) verdict, for many runs in one query."""
    latest: dict[int, Verdict] = {}
    for verdict in Verdict.objects.filter(run_id__in=list(run_ids)).select_related("author"):
        latest.setdefault(verdict.run_id, verdict)  # ordered newest first
    return latest


def pinned_baselines(experiment_ids: Iterable[int]) -> dict[int, int]:
    """experiment id -> pinned baseline run id (one query)."""
    return dict(
        BaselinePin.objects.filter(experiment_id__in=list(experiment_ids)).values_list(
            "experiment_id", "run_id"
        )
    )


def series_for(
    runs: Sequence[Run], keys: list[str], *, start=None, end=None
) -> dict[int, RunSeries]:
    """Raw full-resolution series of many runs (two queries). A key's series holds
    only the steps that logged it; NaN is a stored non-finite value (a gap)."""
    return metric_series_many([r.pk for r in runs], keys, start=start, end=end)


def series_of(data: RunSeries, key: str) -> Series:
    return data.series[key]


def collapse_marker(run: Run) -> CollapseMarker | None:
    summary = run.summary or {}
    if summary.get("collapsed") and summary.get("collapse_step") is not None:
        return CollapseMarker(
            int(summary["collapse_step"]), str(summary.get("collapse_reason") or "")
        )
    return None


def steps_run(first_step: int, last_step: int) -> int:
    """How many steps a run ran, from its stored step range (docs/design.md, section
    3.6): the lab counts steps from 0, so a run that stored 0 .. N - 1 ran N; TRL, verl
    and most trackers count from 1, so a run whose steps start above 0 ran its last."""
    return last_step + 1 if first_step <= 0 else last_step


def run_outcome(run: Run, step_range: tuple[int, int] | None) -> RunOutcome | None:
    """Collapse step, or censoring at the steps run (``steps_run`` of the stored
    (first, last) step range, else summary.json's ``steps``). None for a run with nothing
    to say yet (no summary and no stored step)."""
    summary = dict(run.summary or {})
    if summary.get("collapsed") and summary.get("collapse_step") is not None:
        return RunOutcome(
            variant_of(run), int(summary["collapse_step"]), True, run.seed, run_label(run)
        )
    end = steps_run(*step_range) if step_range is not None else summary.get("steps")
    if end is None:
        return None
    return RunOutcome(variant_of(run), int(end), False, run.seed, run_label(run))


def outcomes_for(runs: Sequence[Run]) -> list[RunOutcome]:
    """Outcomes of runs that have one (one query for the step ranges)."""
    spans = metric_step_ranges([r.pk for r in runs])
    return [o for r in runs if (o := run_outcome(r, spans.get(r.pk))) is not None]


def run_records(runs: Sequence[Run]) -> list[RunRecord]:
    """The causal panel's run records (``trainer.analysis.run_record.RunRecord``), one
    metrics query: each judged run's config and outcome, and its routing gap over
    its first steps (natural top-k of training vs the rollout engine). A run not
    judged yet (no outcome) or whose stored config no longer validates is left out."""
    data = series_for(runs, [mk.MISMATCH_ROUTING_INCONSISTENCY], end=GAP_STEPS - 1)
    records = []
    for run in runs:
        summary = run.summary or {}
        if "collapsed" not in summary or summary.get("steps") is None:
            continue  # not judged yet: no time and no event
        try:
            cfg = ExperimentConfig.model_validate(run.config or {})
        except ValidationError:
            continue
        _, values = series_of(data[run.pk], mk.MISMATCH_ROUTING_INCONSISTENCY)
        gap = np.asarray(values, dtype=float)
        gap = mean_gap(gap[np.isfinite(gap)].tolist())
        records.append(RunRecord.of(cfg, summary, variant=variant_of(run), gap=gap))
    return records


STABILITY_KEYS = [
    mk.MISMATCH_KL_K3,
    mk.MISMATCH_KL_K1,  # the KL column's fallbacks (dashboard/charts/stability.py)
    mk.MISMATCH_LOGP_ABS_DIFF,
    mk.MISMATCH_PROB_ABS_DIFF,
    mk.MISMATCH_ROUTING_INCONSISTENCY,
    mk.MISMATCH_EXTREME_TOKEN_FRAC,
    mk.EVAL_ACCURACY,
]


@dataclass(frozen=True)
class StabilityInput:
    stats: list[RunStats]
    skipped: list[Run]  # runs with no outcome yet (queued, nothing stored)


def stability_stats(runs: Sequence[Run]) -> StabilityInput:
    """Per-run table inputs from one metrics query for the whole set."""
    data = series_for(runs, STABILITY_KEYS)
    stats, skipped = [], []
    for run in runs:
        entry = data[run.pk]
        step_range = (int(entry.steps[0]), int(entry.steps[-1])) if entry.steps.size else None
        outcome = run_outcome(run, step_range)
        if outcome is None:
            skipped.append(run)
            continue
        final = (run.summary or {}).get("final_accuracy")
        stats.append(
            RunStats.from_series(
                outcome,
                {k: series_of(entry, k) for k in STABILITY_KEYS},
                final_accuracy=final if isinstance(final, int | float) else None,
            )
        )
    return StabilityInput(stats, skipped)


def log_tail(run: Run, max_bytes: int = LOG_TAIL_BYTES) -> str | None:
    """The end of the run's log file, or None when there is none (yet).

    The file must lie inside the configured runs folder: ``run_dir`` is data.
    """
    if not run.run_dir:
        return None
    path = Path(run.run_dir) / LOG_FILE
    try:
        root = Path(settings.RUNS_DIR).resolve()
        resolved = path.resolve()
        if root not in resolved.parents:
            return None
        with open(resolved, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            blob = fh.read()
    except OSError:
        return None
    text = blob.decode("utf-8", errors="replace")
    if size > max_bytes:
        text = text.split("\n", 1)[-1]  # drop the partial first line
    return text
