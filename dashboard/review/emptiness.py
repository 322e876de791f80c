"""What an empty chart says: why a metric has no point to draw for a run.

* "not logged by this run": the run will never log the metric, because its
  config does not produce it (an MoE-only metric of a dense model) or because
  the run is over and never logged it.
* "waiting for the first step": the run has no RL step stored yet (queued, or
  in its warm start).
* "no data yet": steps are stored, this metric is not among them yet (e.g. a
  held-out accuracy logged every ``run.eval_every`` steps).
"""

from __future__ import annotations

from lab.runs.models import Run
from trainer import metric_keys as mk

NOT_LOGGED = "not logged by this run"
WAITING = "waiting for the first step"
NO_DATA = "no data yet"


def config_never_logs(config: dict, key: str) -> bool:
    """True when a run with this config can never log ``key``."""
    dense = not (config.get("model") or {}).get("n_experts")
    return dense and (mk.metric_spec(key).moe_only or mk.is_vector_key(key))


def empty_reason(run: Run, key: str) -> str:
    """The message of ``run``'s chart of ``key`` when it has no point."""
    if config_never_logs(run.config or {}, key) or not run.is_active:
        return NOT_LOGGED
    if run.current_step <= 0:
        return WAITING
    return NO_DATA
