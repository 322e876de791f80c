"""The ONE config schema shared by the trainer CLI, the REST API and the browser form.

Every field has a default and help text; unknown keys and wrong types are
rejected with the field's dotted path (``algorithm.clip_eps_low: ...``) so the
CLI, the API and the form can all point at the offending field.

Sections: model, task, warm_start, rollout, algorithm, stabilizers, optim, run, parallel.
``task`` is one model per task kind, picked by ``task.name`` (arithmetic | sort | text);
``stabilizers`` has one sub-section per owner (replay, balance, surgery,
is_correction, router_temperature, noisy_gating). The previous release's flat
paths still load for one release (``trainer.config.migration``), with a
``ConfigDeprecationWarning`` naming the new path.
Presets (``trainer.config.presets``) are partial configs layered over these defaults,
never code paths.

One module per section (``trainer.config.model``, ``.task``, ... ``.parallel``), the
root with the checks across sections (``.experiment``) and the dict helpers
(``.overrides``); everything is importable from ``trainer.config`` as before.
"""

from __future__ import annotations

from typing import Any

from trainer.config.algorithm import (
    AdvantageConfig,
    AlgorithmConfig,
)
from trainer.config.experiment import (
    ExperimentConfig,
)
from trainer.config.model import (
    RESERVED_TEMPLATE_VARIABLES,
    ModelConfig,
    RopeScalingConfig,
)
from trainer.config.model_parts import (
    ExpertFfnConfig,
    MlaConfig,
    RouterConfig,
)
from trainer.config.optim import (
    OptimConfig,
)
from trainer.config.overrides import (
    apply_overrides,
    deep_merge,
    parse_override,
)
from trainer.config.parallel import (
    ParallelConfig,
)
from trainer.config.rollout import (
    RolloutConfig,
)
from trainer.config.run import (
    CollapseConfig,
    RunConfig,
)
from trainer.config.section import (
    ConfigDeprecationWarning,
    Section,
)
from trainer.config.stabilizers import (
    BalanceConfig,
    ISCorrectionConfig,
    NoisyGatingConfig,
    ReplayConfig,
    RouterTemperatureConfig,
    StabilizersConfig,
    SurgeryConfig,
)
from trainer.config.task import (
    ArithmeticTaskConfig,
    SortTaskConfig,
    TaskBase,
    TaskConfig,
    TextTaskConfig,
)
from trainer.config.warm_start import (
    WarmStartConfig,
)


def json_schema() -> dict[str, Any]:
    """JSON Schema of the full config (served by the API, shown by the CLI)."""
    return ExperimentConfig.model_json_schema()


__all__ = [
    "RESERVED_TEMPLATE_VARIABLES",
    "AdvantageConfig",
    "AlgorithmConfig",
    "ArithmeticTaskConfig",
    "BalanceConfig",
    "CollapseConfig",
    "ConfigDeprecationWarning",
    "ExperimentConfig",
    "ExpertFfnConfig",
    "ISCorrectionConfig",
    "MlaConfig",
    "ModelConfig",
    "NoisyGatingConfig",
    "OptimConfig",
    "ParallelConfig",
    "ReplayConfig",
    "RolloutConfig",
    "RopeScalingConfig",
    "RouterConfig",
    "RouterTemperatureConfig",
    "RunConfig",
    "Section",
    "SortTaskConfig",
    "StabilizersConfig",
    "SurgeryConfig",
    "TaskBase",
    "TaskConfig",
    "TextTaskConfig",
    "WarmStartConfig",
    "apply_overrides",
    "deep_merge",
    "json_schema",
    "parse_override",
]
