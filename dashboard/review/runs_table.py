"""An experiment's runs as a table, as W&B and MLflow teams read their runs: one row
per run, chosen hyperparameter columns (a lab run's config fields by dotted path, an
external run's MLflow params) and summary-metric columns (each metric's last logged
value), sorted by any column and filtered with MLflow's own search grammar
(``params.lr = '1e-6' and metrics.`reward/mean` > 0.5``: mlflow's SearchUtils, as the
tracking API's search). The parallel-coordinates figure and the CSV read the same
rows (dashboard/charts/figures/parallel.py).

Reads: the runs (one query), their MLflow records (one), the chosen metrics' series
(one metric read, runs/metrics/read.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dashboard.charts.configdiff import flatten
from dashboard.review.queries import run_label, series_for, variant_of
from lab.runs.models import Run
from lab.tracking.models import TrackedRun
from lab.tracking.services import LAB_TO_MLFLOW_STATUS
from trainer import metric_keys as mk

MAX_PARAM_COLUMNS = 12
MAX_METRIC_COLUMNS = 12
DEFAULT_METRICS = (mk.REWARD_ACCURACY, mk.REWARD_MEAN, mk.MISMATCH_KL_K3, mk.EVAL_ACCURACY)
# Config paths that are not hyperparameters (where the run ran, its bookkeeping)
NOT_HYPERPARAMETERS = ("run.out", "run.threads", "run.checkpoint_every", "params.")


@dataclass
class TableRow:
    run: Run
    label: str
    variant: str
    parent_id: int | None
    params: dict[str, str]
    metrics: dict[str, float]
    collapse_step: int | None
    collapsed: bool | None

    def value(self, column: str) -> Any:
        """A cell's value for sorting and the CSV: ``param:<key>``, ``metric:<key>``,
        or a fixed column's name."""
        kind, _, key = column.partition(":")
        if kind == "param":
            return self.params.get(key)
        if kind == "metric":
            return self.metrics.get(key)
        return {
            "run": self.run.pk,
            "variant": self.variant,
            "seed": self.run.seed,
            "status": self.run.status,
            "steps": self.run.current_step,
            "collapse_step": self.collapse_step,
        }.get(column)


def run_params(run: Run) -> dict[str, str]:
    """A run's hyperparameters as text: an external run's MLflow params, a lab run's
    config fields by dotted path."""
    if run.is_external:
        return {k: str(v) for k, v in ((run.config or {}).get("params") or {}).items()}
    flat = flatten({k: v for k, v in (run.config or {}).items() if k != "params"})
    return {
        k: v if isinstance(v, str) else _text(v)
        for k, v in flat.items()
        if not k.startswith(NOT_HYPERPARAMETERS)
    }


def _text(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else ""
    return str(value)


def varying_params(params: Sequence[dict[str, str]]) -> list[str]:
    """Keys with two values or more among the runs that have them, by name (a field
    only the lab's runs have, or only one run, is not one that varies)."""
    keys = sorted({k for p in params for k in p})
    return [k for k in keys if len({p[k] for p in params if k in p}) > 1]


def available_metrics(runs: Sequence[Run], tracked: dict[int, TrackedRun]) -> list[str]:
    """Metric keys a summary column can show: the registry's scalars, and every name
    an external run stored (its lab keys and its unmapped names)."""
    keys = set(mk.SCALAR_KEYS)
    for record in tracked.values():
        keys |= set(record.stored_as.values())
        keys |= {n for n in record.latest_metrics if n not in record.stored_as}
    return sorted(k for k in keys if mk.METRIC_NAME.fullmatch(k) and not mk.is_vector_key(k))


def last_values(runs: Sequence[Run], keys: Sequence[str]) -> dict[int, dict[str, float]]:
    """Each run's last finite value of each key (one metric read)."""
    if not runs or not keys:
        return {r.pk: {} for r in runs}
    data = series_for(runs, list(keys))
    out: dict[int, dict[str, float]] = {}
    for run in runs:
        values = {}
        for key in keys:
            _, ys = data[run.pk].series[key]
            finite = np.asarray(ys, dtype=np.float64)
            finite = finite[np.isfinite(finite)]
            if finite.size:
                values[key] = float(finite[-1])
        out[run.pk] = values
    return out


def table_rows(runs: Sequence[Run], metric_keys: Sequence[str]) -> list[TableRow]:
    tracked = {t.run_id: t for t in TrackedRun.objects.filter(run_id__in=[r.pk for r in runs])}
    metrics = last_values(runs, metric_keys)
    rows = []
    for run in runs:
        summary = run.summary or {}
        record = tracked.get(run.pk)
        rows.append(
            TableRow(
                run=run,
                label=run_label(run),
                variant=variant_of(run),
                parent_id=record.parent_id if record else None,
                params=run_params(run),
                metrics=metrics.get(run.pk, {}),
                collapse_step=summary.get("collapse_step") if summary.get("collapsed") else None,
                collapsed=summary.get("collapsed"),
            )
        )
    return rows


def filter_rows(rows: list[TableRow], filter_string: str) -> list[TableRow]:
    """The rows an MLflow search filter keeps (its grammar and semantics: mlflow's
    SearchUtils over the rows as MLflow runs); ValueError with MLflow's message for a
    filter it refuses."""
    if not filter_string.strip():
        return rows
    from mlflow.entities import Metric, Param, RunData, RunInfo, RunTag
    from mlflow.entities import Run as MlflowRun
    from mlflow.exceptions import MlflowException
    from mlflow.utils.search_utils import SearchUtils

    entities = {}
    for row in rows:
        run = row.run
        info = RunInfo(
            run_id=str(run.pk),
            experiment_id=str(run.experiment_id),
            user_id=run.owner.get_username(),
            status=LAB_TO_MLFLOW_STATUS[run.status],
            start_time=int(run.created_at.timestamp() * 1000),
            end_time=None,
            lifecycle_stage="active",
            run_name=row.variant,
        )
        data = RunData(
            metrics=[Metric(k, v, 0, 0) for k, v in row.metrics.items()],
            params=[Param(k, v) for k, v in row.params.items()],
            tags=[RunTag("seed", str(run.seed)), RunTag("variant", row.variant)],
        )
        entities[str(run.pk)] = MlflowRun(info, data)
    try:
        kept = SearchUtils.filter(list(entities.values()), filter_string)
    except MlflowException as exc:
        raise ValueError(exc.message) from None
    except (TypeError, IndexError, AttributeError) as exc:
        raise ValueError(f"not a filter MLflow reads: {exc}") from None
    ids = {e.info.run_id for e in kept}
    return [row for row in rows if str(row.run.pk) in ids]


def sort_rows(rows: list[TableRow], column: str, descending: bool) -> list[TableRow]:
    """Rows by one column; missing values last either way; numbers as numbers."""

    def key(row: TableRow) -> tuple:
        value = row.value(column)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return (1, 0, "")
        number = _number(value)
        if number is not None:
            return (0, 0, -number if descending else number)
        return (0, 1, value)

    ordered = sorted(rows, key=key)
    if descending:  # numbers were negated; text is reversed within its group
        texts = [r for r in ordered if key(r)[:2] == (0, 1)]
        texts.reverse()
        ordered = (
            [r for r in ordered if key(r)[:2] == (0, 0)]
            + texts
            + [r for r in ordered if key(r)[0] == 1]
        )
    return ordered


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None
